"""Slurm in the cluster: its slurm.conf, munged, slurmctld and the slurmds, and the wait until
every node is idle."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import VclusterError, checkpoint, log_tail, wait_for
from .procs import daemon_env, running, start

BASE_SETTINGS = (
    "SlurmUser=root",
    "SlurmdUser=root",
    "AuthType=auth/munge",
    "CredType=cred/munge",
    # slurmd 22.05 sets up its cgroup plugin even with these; all nodes share one PID namespace
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "MpiDefault=none",
    "SelectType=select/cons_tres",
    "ReturnToService=2",
)
"""What every Slurm cluster started on this machine has: root daemons, munge, no cgroups."""


def slurm_conf_text(
    *,
    cluster_name: str,
    controller: tuple[str, str],
    ports: tuple[int, int],
    nodes: Sequence[tuple[str, str]],
    cpus: int,
    files: Mapping[str, str],
    settings: Sequence[str] = (),
    node_options: str = "",
) -> str:
    """A slurm.conf: the one writer for vcluster and the tests' single-node cluster. `controller`
    is slurmctld's (host, address), `ports` slurmctld's and slurmd's, `nodes` (name, address),
    `files` the state, spool, pid and log locations, `settings` lines beyond BASE_SETTINGS."""
    lines = [
        f"ClusterName={cluster_name}",
        f"SlurmctldHost={controller[0]}({controller[1]})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        *BASE_SETTINGS,
        *settings,
        *(f"{key}={value}" for key, value in files.items()),
    ]
    for name, address in nodes:
        lines.append(f"NodeName={name} NodeAddr={address} CPUs={cpus}{node_options} State=UNKNOWN")
    names = ",".join(name for name, _ in nodes)
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def slurm_conf(state: dict[str, Any]) -> str:
    """The cluster's slurm.conf: its own ports and munge socket, each node a spool, pid and log."""
    s, ports = state["state_dir"], state["ports"]
    settings = [
        f"SrunPortRange={ports['srun_first']}-{ports['srun_last']}",
        f"AuthInfo=socket={state['munge_socket']}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",  # --cpus above the machine's count is not a drain
        "SlurmdTimeout=30",
        "MessageTimeout=10",
        "KillWait=5",
        "MailProg=/bin/true",
        "TmpFS=/local",
    ]
    files = {  # the nodes share one file system: each slurmd its own spool, pid and log (%n)
        "StateSaveLocation": f"{s}/ctld",
        "SlurmdSpoolDir": f"{s}/spool/%n",
        "SlurmctldPidFile": f"{s}/run/slurmctld.pid",
        "SlurmdPidFile": f"{s}/run/slurmd-%n.pid",
        "SlurmctldLogFile": f"{s}/log/slurmctld.log",
        "SlurmdLogFile": f"{s}/log/slurmd-%n.log",
    }
    return slurm_conf_text(
        cluster_name=state["cluster_name"],
        controller=("login", state["login"]["address"]),
        ports=(ports["slurmctld"], ports["slurmd"]),
        nodes=[(n["name"], n["address"]) for n in state["nodes"]],
        cpus=state["cpus"],
        files=files,
        settings=settings,
    )


def sinfo_states(state: dict[str, Any]) -> dict[str, str]:
    """Each node's state as slurmctld sees it, asked from the login host."""
    argv = [
        "nsenter",
        "-t",
        str(state["login"]["pid"]),
        "-u",
        "-m",
        "-n",
        "--",
        "sinfo",
        "-h",
        "-N",
        "-o",
        "%N %T",
    ]
    try:
        proc = subprocess.run(
            argv, env=daemon_env(state), capture_output=True, text=True, timeout=15, check=False
        )
    except subprocess.TimeoutExpired:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)


def start_munged(state: dict[str, Any]) -> None:
    """munged on the login host, with the cluster's own key and socket; waits for its socket."""
    sdir = Path(state["state_dir"])
    munge = sdir / "munge"
    # munged as user munge on the login host; its socket folder must be 755, owned by munge
    uid, gid = pwd.getpwnam("munge").pw_uid, pwd.getpwnam("munge").pw_gid
    login = str(state["login"]["pid"])
    start(
        state,
        "munged",
        [
            "nsenter",
            "-t",
            login,
            "-u",
            "-m",
            "-n",
            "-S",
            str(uid),
            "-G",
            str(gid),
            "--",
            "munged",
            "--foreground",
            f"--socket={state['munge_socket']}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
        sdir / "log" / "munged.out",
        env=daemon_env(state),
    )

    def munge_ready() -> bool:
        if not running(state, "munged"):
            raise VclusterError(f"munged exited: {log_tail(munge / 'munged.log')}")
        return Path(state["munge_socket"]).exists()

    wait_for(munge_ready, "munged", 10, munge / "munged.log")


def start_slurmctld(state: dict[str, Any]) -> None:
    """slurmctld on the login host."""
    sdir = Path(state["state_dir"])
    login = str(state["login"]["pid"])
    start(
        state,
        "slurmctld",
        ["nsenter", "-t", login, "-u", "-m", "-n", "--", "slurmctld", "-D", "-f", state["slurm_conf"]],
        sdir / "log" / "slurmctld.out",
        env=daemon_env(state),
    )
    checkpoint("slurmctld")


def start_slurmds(state: dict[str, Any]) -> None:
    """One slurmd per node, in that node's namespaces."""
    sdir = Path(state["state_dir"])
    for node in state["nodes"]:
        node["slurmd_pid"] = start(
            state,
            f"slurmd-{node['name']}",
            [
                "nsenter",
                "-t",
                str(node["pid"]),
                "-u",
                "-m",
                "-n",
                "--",
                "slurmd",
                "-D",
                "-N",
                node["name"],
                "-f",
                state["slurm_conf"],
            ],
            sdir / "log" / f"slurmd-{node['name']}.out",
            env=daemon_env(state),
        )


def wait_idle(state: dict[str, Any], timeout_s: float) -> None:
    """Until sinfo shows every node idle; a recorded process that ended fails it with its log."""
    sdir = Path(state["state_dir"])
    names = {n["name"] for n in state["nodes"]}

    def idle() -> bool:
        for key in state["pids"]:
            if not running(state, key):
                log = (
                    sdir
                    / "log"
                    / {
                        "munged": "munged.out",
                        "switch": "holder-switch.log",
                        "login": "holder-login.log",
                    }.get(key, f"{key}.log" if "slurm" in key else f"holder-{key}.log")
                )
                raise VclusterError(f"{key} exited: {log_tail(log)}")
        states = sinfo_states(state)
        return names <= states.keys() and all(states[n].startswith("idle") for n in names)

    wait_for(idle, "the Slurm nodes (idle in sinfo)", timeout_s, sdir / "log" / "slurmctld.log")
