"""The command line: the parser, `exec`, `status`, `list`, `shape`, `link`, and main, which
checks the name and root before any command runs."""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
from typing import Any

from . import __doc__ as package_doc
from .base import NAME_RE, VclusterError, in_ns, shown
from .down import cmd_down
from .network import apply_shape, check_delay, rate_bytes_s
from .procs import holder_keys, running
from .state import check_root, load_state, locked, read_state, root, save_state, state_dir
from .up import cmd_up


def host_pid(state: dict[str, Any], target: str) -> int:
    names = [n["name"] for n in state["nodes"]]
    if target not in holder_keys(state):
        raise VclusterError(
            f"no host '{target}' in cluster '{state['name']}'; known: login, switch, {', '.join(names)}"
        )
    if not running(state, target):
        raise VclusterError(
            f"host '{target}' of cluster '{state['name']}' is not running; take the cluster down and start it "
            f"again: scripts/vcluster down --name {state['name']}, then scripts/vcluster up --name {state['name']}"
        )
    return state["pids"][target]


def cmd_exec(args: argparse.Namespace) -> None:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise VclusterError("exec: give a command after the host: scripts/vcluster exec login -- sinfo")
    state = load_state(args.name)
    pid = host_pid(state, args.host)
    # the caller's SLURM_* (an outer job's) would mislead srun/sbatch; the cluster's config replaces them
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_CONF=state["slurm_conf"], VCLUSTER_NAME=state["name"])
    argv = ["nsenter", "-t", str(pid), "-u", "-m", "-n", f"--wd={os.getcwd()}", "--", *command]
    os.execvpe("nsenter", argv, env)


def cmd_status(args: argparse.Namespace) -> None:
    state = load_state(args.name)
    running_now = {key: running(state, key) for key in state["pids"]}
    state["running"] = running_now
    state["up"] = state.get("phase") == "up" and bool(running_now) and all(running_now.values())
    for node in state["nodes"]:
        node["running"] = running_now.get(node["name"], False) and running_now.get(
            f"slurmd-{node['name']}", False
        )
    if args.json:
        print(json.dumps(state, indent=1, sort_keys=True))
        return
    print(
        f"cluster {state['name']} ({state['cluster_name']}): {'up' if state['up'] else 'NOT up: ' + state.get('phase', '?')}, "
        f"subnet {state['subnet']}, state {state['state_dir']}"
    )
    print(
        f"  login   {state['login']['address']:<15} pid {state['login'].get('pid')}  slurmctld {state['pids'].get('slurmctld')}"
        f"  munged {state['pids'].get('munged')}"
    )
    for n in state["nodes"]:
        print(
            f"  {n['name']:<7} {n['address']:<15} pid {n.get('pid')}  slurmd {n.get('slurmd_pid')}  link {n['link']}"
            f"  shape {n['shape'] or '-'}  /local {n['local']}  {'running' if n['running'] else 'NOT running'}"
        )
    sys.exit(0 if state["up"] else 1)


def cmd_list(args: argparse.Namespace) -> None:
    clusters = []
    for sdir in sorted(root().iterdir()) if check_root(create=False) else []:
        if stat.S_ISREG(os.lstat(sdir).st_mode):  # a folder or a link in its place is listed
            continue
        try:
            state = read_state(sdir)
            phase = state.get("phase")
            up = phase == "up" and all(running(state, key) for key in state["pids"])
        except (OSError, VclusterError):
            phase, up = "not vcluster's (left alone)", False
        clusters.append({"name": sdir.name, "up": up, "phase": phase, "state_dir": str(sdir)})
    if args.json:
        print(json.dumps(clusters, indent=1))
    for c in [] if args.json else clusters:
        print(
            shown(f"{c['name']}  {'up' if c['up'] else 'NOT up (' + str(c['phase']) + ')'}  {c['state_dir']}")
        )


def find_node(state: dict[str, Any], name: str) -> dict[str, Any]:
    for node in state["nodes"]:
        if node["name"] == name:
            host_pid(state, name)
            return node
    raise VclusterError(
        f"no node '{name}' in cluster '{state['name']}'; known: {', '.join(n['name'] for n in state['nodes'])}"
    )


def cmd_shape(args: argparse.Namespace) -> None:
    if not args.clear and not (args.rate or args.delay):
        raise VclusterError("shape: give --rate and/or --delay, or --clear")
    if args.rate:
        rate_bytes_s(args.rate)
    check_delay(args.delay)
    load_state(args.name)
    with locked(state_dir(args.name)):
        state = load_state(args.name)
        node = find_node(state, args.node)
        apply_shape(state, node, None if args.clear else args.rate, None if args.clear else args.delay)
        save_state(state)
    print(f"vcluster: {args.node} link {'unshaped' if args.clear else node['shape']}")


def cmd_link(args: argparse.Namespace) -> None:
    load_state(args.name)
    with locked(state_dir(args.name)):
        state = load_state(args.name)
        node = find_node(state, args.node)
        # the switch-side end: the node's eth0 loses its carrier, as when a cable or switch port fails
        in_ns(state["pids"]["switch"], ["ip", "link", "set", args.node, args.state], what="ip link")
        node["link"] = args.state
        save_state(state)
    print(f"vcluster: {args.node} link {args.state}")


# --- command line -----------------------------------------------------------------------------


DOC: str = package_doc or ""


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors print as one line with the values shown as data."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"vcluster: {shown(message)}; see scripts/vcluster --help\n")


def add_up_options(up: argparse.ArgumentParser) -> None:
    """The options of `up`: size, shaping, node-local disks, CPUs, /tmp and the wait."""
    up.add_argument("--nodes", type=int, default=4, help="compute nodes node01.. (4)")
    up.add_argument(
        "--rate", help="shape every node link to this rate, both directions (tc tbf; e.g. 100mbit)"
    )
    up.add_argument(
        "--delay", help="one-way delay on every node link, both directions (e.g. 5ms; needs tc netem)"
    )
    up.add_argument(
        "--small-local",
        action="append",
        metavar="NODE:SIZE",
        help="that node's /local is a tmpfs of SIZE (e.g. node03:64M), to fill it; repeatable",
    )
    up.add_argument(
        "--cpus",
        type=int,
        default=os.cpu_count() or 1,
        help="CPUs Slurm gives each node (this machine's count)",
    )
    up.add_argument(
        "--shared-tmp",
        action="store_true",
        help="nodes see the host's /tmp (default: each node its own /tmp, as on a real cluster)",
    )
    up.add_argument(
        "--see",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder in the host's /tmp that every node still sees over its own /tmp (a checkout); repeatable",
    )
    up.add_argument("--timeout", type=float, default=30, help="seconds to wait for every node idle (30)")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vcluster",
        description=DOC.split("\n\n", 1)[0],
        epilog=DOC.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def named(name: str, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help)
        cmd.add_argument(
            "--name",
            default="mlhpc",
            help="cluster name: own state folder, subnet, ports, ClusterName (mlhpc)",
        )
        return cmd

    add_up_options(named("up", "start a cluster"))
    ex = named("exec", "run a command on a host of the cluster (login for Slurm clients)")
    ex.add_argument("host", help="login, switch or nodeNN")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    st = named("status", "the cluster's hosts, addresses, PIDs and state folder")
    st.add_argument("--json", action="store_true", help="machine-readable")
    sh = named("shape", "shape one node's link (both directions), or --clear it")
    sh.add_argument("node")
    sh.add_argument("--rate")
    sh.add_argument("--delay")
    sh.add_argument("--clear", action="store_true")
    ln = named("link", "take a node's link down or bring it up (its switch port)")
    ln.add_argument("node")
    ln.add_argument("state", choices=["down", "up"])
    named("down", "end every process of the cluster and remove its state")
    ls = sub.add_parser(
        "list", help="the clusters on this machine, one a line (name, up or not, state folder)"
    )
    ls.add_argument("--json", action="store_true", help="machine-readable")
    ls.set_defaults(name="mlhpc")
    return p


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    if not NAME_RE.fullmatch(args.name):
        raise VclusterError(
            f"--name {args.name!r}: use a-z, 0-9 and _, starting with a letter, at most 24 characters"
        )
    if os.geteuid() != 0:
        raise VclusterError("needs root (namespaces, mounts, Slurm daemons); run it as root, e.g. with sudo")
    check_root(create=False)  # refused here, before any command looks inside it
    handler = {
        "up": cmd_up,
        "down": cmd_down,
        "exec": cmd_exec,
        "status": cmd_status,
        "shape": cmd_shape,
        "link": cmd_link,
        "list": cmd_list,
    }
    if args.cmd == "up":  # a TERM or HUP to `up` takes down what it started, as an error does
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, interrupt)
    handler[args.cmd](args)


def entry(argv: list[str]) -> None:
    """Run one command; a VclusterError is one line on stderr and exit status 1."""
    try:
        main(argv)
    except VclusterError as e:
        print(f"vcluster: {shown(e)}", file=sys.stderr)
        sys.exit(1)
