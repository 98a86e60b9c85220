"""`vcluster up`: the checks of its options, the state of a new cluster, its hosts' namespaces,
and the bring-up in phases (each a fault-injection checkpoint for the tests)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import pwd
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from .base import LOGIN_HOST, SIZE_RE, TOOLS, VclusterError, checkpoint, log_tail, wait_for
from .down import teardown
from .network import check_delay, connect_hosts, pick_index, rate_bytes_s
from .procs import daemon_env, holder_keys, running, start
from .slurm import slurm_conf, start_munged, start_slurmctld, start_slurmds, wait_idle
from .state import (
    HOST_DIR,
    HOST_LOCAL,
    LOCAL_MADE,
    check_root,
    locked,
    read_state,
    root,
    save_state,
    state_dir,
)


def see_under_tmp(paths: list[str]) -> list[str]:
    """--see: existing folders under the host's /tmp, resolved; refused in one line otherwise."""
    seen = []
    for given in paths:
        path = Path(given).resolve()
        if not path.is_dir():
            raise VclusterError(f"--see {given}: not a folder; give one every node must keep seeing")
        if path == Path("/tmp") or Path("/tmp") not in path.parents:
            raise VclusterError(
                f"--see {given}: only a folder inside /tmp needs it (the rest of the host is seen)"
            )
        seen.append(str(path))
    return seen


def memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise VclusterError("/proc/meminfo has no MemTotal; is /proc mounted?")


def parse_small_local(values: list[str], nodes: list[str]) -> dict[str, int]:
    """--small-local NODE:SIZE, once per node, in bytes: at least 1 MiB (tmpfs reads size=0 as no
    limit), all of them together at most half the machine's memory (tmpfs's own default)."""
    out: dict[str, int] = {}
    for value in values:
        node, _, size = value.partition(":")
        match = SIZE_RE.fullmatch(size)
        if node not in nodes or node in out or match is None:
            raise VclusterError(
                f"--small-local {value}: give NODE:SIZE once per node, NODE one of {nodes[0]}..{nodes[-1]}, "
                "e.g. node03:64M"
            )
        out[node] = int(match.group(1)) << 10 * " kmg".index(match.group(2).lower() or " ")
        if out[node] < 1 << 20:
            raise VclusterError(f"--small-local {value}: give at least 1M (a tmpfs of size 0 has no limit)")
    budget = memory_bytes() // 2
    if sum(out.values()) > budget:
        raise VclusterError(
            f"--small-local: {sum(out.values()) >> 20} MiB in all, more than half this machine's memory "
            f"({budget >> 20} MiB); give smaller sizes"
        )
    return out


def check_tools() -> None:
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            raise VclusterError(f"{tool} not found; install it: apt-get install {package}")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        raise VclusterError("no user 'munge'; install it: apt-get install munge") from None


def check_counts(args: argparse.Namespace) -> None:
    if not 1 <= args.nodes <= 250:
        raise VclusterError(f"--nodes {args.nodes}: give 1 to 250")
    if not 1 <= args.cpus <= 4096:
        raise VclusterError(f"--cpus {args.cpus}: give 1 to 4096")
    if not 1 <= args.timeout <= 3600:  # NaN fails too: a wait that could never end
        raise VclusterError(f"--timeout {args.timeout}: give 1 to 3600 seconds")
    if args.rate:
        rate_bytes_s(args.rate)
    check_delay(args.delay)


def clear_leftover(name: str) -> None:
    """A dead cluster of this name (proven vcluster's) is taken down before `up`; a live one or a
    folder vcluster did not make is refused."""
    sdir = state_dir(name)
    try:
        state = read_state(sdir)
    except FileNotFoundError:
        return
    if any(running(state, key) for key in state.get("pids", {})):
        raise VclusterError(
            f"cluster '{name}' is already up ({sdir}); stop it: scripts/vcluster down --name {name}"
        )
    problems = teardown(name)
    if problems:
        raise VclusterError(f"cluster '{name}' left over could not be cleared: {'; '.join(problems)}")


def cmd_up(args: argparse.Namespace) -> None:
    check_tools()
    started = time.monotonic()
    check_counts(args)
    names = [f"node{i:02d}" for i in range(1, args.nodes + 1)]
    small = parse_small_local(args.small_local or [], names)
    see = see_under_tmp(args.see)  # checked before anything is made
    sdir = state_dir(args.name)
    check_root(create=True)
    clear_leftover(args.name)
    with locked(root()):
        if os.path.lexists(sdir):
            raise VclusterError(f"cluster '{args.name}' is being started by another command ({sdir})")
        k = pick_index()
        os.mkdir(sdir, 0o755)
        state = new_state(args, k, os.lstat(sdir), names, small, see)
        save_state(state)  # at once: from here on the folder is provably this cluster's
    try:
        bring_up(state, args)
    except BaseException as e:
        teardown(args.name)
        if isinstance(e, KeyboardInterrupt):
            raise VclusterError("interrupted; what it had started is taken down again") from e
        raise
    state["up_seconds"] = round(time.monotonic() - started, 2)
    state["phase"] = "up"
    save_state(state)
    print(
        f"vcluster: {args.name} up in {state['up_seconds']} s: {len(names)} nodes, login {state['login']['address']}, "
        f"subnet {state['subnet']}, state {sdir}; clients: scripts/vcluster exec --name {args.name} login -- sinfo"
    )


def new_state(
    args: argparse.Namespace,
    k: int,
    folder: os.stat_result,
    names: list[str],
    small: dict[str, int],
    see: list[str],
) -> dict[str, Any]:
    """The state of a cluster about to start; `tool` and `folder` (device, inode) are the proof
    that the folder is this cluster's, asked before `down` deletes or kills anything."""
    sdir = state_dir(args.name)
    net = ipaddress.ip_network(f"10.213.{k}.0/24")
    return {
        "tool": "vcluster",
        "folder": [folder.st_dev, folder.st_ino],
        "name": args.name,
        "cluster_name": f"vc_{args.name}"[:40],
        "index": k,
        "state_dir": str(sdir),
        "subnet": str(net),
        "phase": "starting",
        "cpus": args.cpus,
        "slurm_conf": str(sdir / "slurm.conf"),
        "munge_socket": str(sdir / "munge" / "munge.socket"),
        "shared": str(sdir / "shared"),
        "ports": {
            "slurmctld": 17000 + 10 * k,
            "slurmd": 17001 + 10 * k,
            "srun_first": 20000 + 100 * k,
            "srun_last": 20099 + 100 * k,
        },
        "pids": {},
        "starts": {},
        "login": {"address": str(net[LOGIN_HOST])},
        "see": see,
        "nodes": [
            {
                "name": n,
                "address": str(net[i + 1]),
                "local": f"tmpfs:{small[n]}" if n in small else str(sdir / "nodes" / n / "local"),
                "tmp": None if args.shared_tmp else str(sdir / "nodes" / n / "tmp"),
                "link": "up",
                "shape": None,
            }
            for i, n in enumerate(names)
        ],
    }


def holder(state: dict[str, Any], key: str, hostname: str, local: str | None, extra: str = "") -> None:
    """A process that owns one host's UTS, mount and network namespaces (`sleep` once set up);
    everything on that host is started inside them with nsenter."""
    s = state["state_dir"]
    q = shlex.quote
    script = [f"hostname {hostname}", f"mount --bind {q(s + '/hosts')} /etc/hosts", "ip link set lo up"]
    if Path("/etc/resolv.conf").exists():  # no name server inside: lookups fail at once, never leave
        script.insert(2, f"mount --bind {q(s + '/resolv.conf')} /etc/resolv.conf")
    if local:
        script.append(local)
    script += [extra, "exec sleep infinity"] if extra else ["exec sleep infinity"]
    argv = ["unshare", "--net", "--uts", "--mount", "--propagation", "slave", "sh", "-ec", "\n".join(script)]
    start(state, key, argv, Path(s) / "log" / f"holder-{hostname}.log", env=daemon_env(state))


def start_holders(state: dict[str, Any]) -> None:
    """The hosts: switch (bridge only, no address), login, nodes; all start at once."""
    sdir = Path(state["state_dir"])
    q = shlex.quote
    holder(state, "switch", "switch", None, "ip link add br0 type bridge\nip link set br0 up")
    holder(state, "login", "login", None)
    for node in state["nodes"]:
        local = node["local"]
        if local.startswith("tmpfs:"):
            mount = f"mount -t tmpfs -o size={int(local[6:])},mode=0755 vcluster-local /local"
        else:
            Path(local).mkdir(parents=True, mode=0o755)
            mount = f"mount --bind {q(local)} /local"
        if node["tmp"]:  # node-local as on a real cluster: two nodes' /tmp/x are two folders
            Path(node["tmp"]).mkdir(parents=True)
            os.chmod(node["tmp"], 0o1777)
            # A folder of the host's /tmp every node must still see (a checkout the jobs run from)
            # is bound into the node's /tmp before that hides the host's; --rbind carries it along.
            for seen in state.get("see", []):
                inside = Path(node["tmp"]) / Path(seen).relative_to("/tmp")
                inside.mkdir(parents=True, exist_ok=True)
                mount += f"\nmount --bind {q(seen)} {q(str(inside))}"
            mount += f"\nmount --rbind {q(node['tmp'])} /tmp"
        holder(state, node["name"], node["name"], mount)
    keys = holder_keys(state)

    def holders_ready() -> bool:
        for key in keys:
            if not running(state, key):
                raise VclusterError(
                    f"host {key} did not start: {log_tail(sdir / 'log' / f'holder-{key}.log')}"
                )
        try:
            return all(Path(f"/proc/{state['pids'][k]}/comm").read_text().strip() == "sleep" for k in keys)
        except OSError:  # one just ended: the next look says which
            return False

    wait_for(holders_ready, "the hosts' namespaces", 10)


def bring_up(state: dict[str, Any], args: argparse.Namespace) -> None:
    """Everything of a new cluster, phase by phase; each phase saves what it started."""
    write_files(state)
    checkpoint("files")
    with locked(HOST_DIR):  # no `down` removes /local before these nodes have mounted it
        if not os.path.lexists(HOST_LOCAL):
            os.close(os.open(LOCAL_MADE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))  # the note first
            HOST_LOCAL.mkdir(mode=0o755)
        start_holders(state)
    state["login"]["pid"] = state["pids"]["login"]
    for node in state["nodes"]:
        node["pid"] = state["pids"][node["name"]]
    save_state(state)
    checkpoint("holders")
    connect_hosts(state, args.rate, args.delay)
    save_state(state)
    checkpoint("network")
    start_munged(state)
    checkpoint("munged")
    start_slurmctld(state)
    checkpoint("slurmctld")
    start_slurmds(state)
    save_state(state)
    checkpoint("slurmd")
    wait_idle(state, args.timeout)
    checkpoint("idle")


def write_files(state: dict[str, Any]) -> None:
    """The state folder's subfolders, the hosts' /etc/hosts and resolv.conf, slurm.conf, munge's key."""
    sdir = Path(state["state_dir"])
    for sub in ("log", "run", "ctld", "spool", "munge", "nodes", "shared"):
        (sdir / sub).mkdir(mode=0o755)
    hosts = [
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        f"{state['login']['address']} login",
    ]
    hosts += [f"{n['address']} {n['name']}" for n in state["nodes"]]
    (sdir / "hosts").write_text("\n".join(hosts) + "\n")
    (sdir / "resolv.conf").write_text(
        "# vcluster: no name server in the cluster; its names are in /etc/hosts\n"
    )
    (sdir / "slurm.conf").write_text(slurm_conf(state))
    munge = sdir / "munge"
    (munge / "munge.key").write_bytes(os.urandom(1024))
    os.chmod(munge / "munge.key", 0o400)
    for path in (munge, munge / "munge.key"):
        shutil.chown(path, "munge", "munge")
