"""Processes: only those recorded at `up` (PID and start time) are the cluster's, and what runs
in their hosts' mount namespaces; starting a daemon records it before anything else."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .state import HOST_LOCAL, save_state


def start_time(pid: int) -> int | None:
    """/proc/PID/stat's start time (clock ticks after boot): with the PID, it names one process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int | None, start: int | None) -> bool:
    """Whether `pid` is still the process that started at `start` (a PID is reused, the pair is
    not), and not a zombie."""
    if not pid or start is None:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 19 and fields[0] != "Z" and fields[19] == str(start)


def running(state: dict[str, Any], key: str) -> bool:
    """Whether the process recorded under `key` (a host's holder or a daemon) still runs."""
    return alive(state["pids"].get(key), state.get("starts", {}).get(key))


def mnt_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def send(pid: int, sig: int, proof: Callable[[int], bool]) -> None:
    """Signal `pid` if `proof(pid)` holds for the very process signalled: a pidfd pins it before
    the look, so a PID reused in between is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone
        return
    try:
        if proof(pid):
            signal.pidfd_send_signal(fd, sig)
    except OSError:  # ended meanwhile
        pass
    finally:
        os.close(fd)


def self_and_parents() -> set[int]:
    spared, pid = set(), os.getpid()
    while pid > 1:
        spared.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return spared


def members(namespaces: set[str], skip: set[int]) -> list[int]:
    """Every process in one of these mount namespaces (job steps, tasks, `exec` clients)."""
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) not in skip and mnt_ns(p.name) in namespaces
    ]


def holder_keys(state: dict[str, Any]) -> list[str]:
    return ["switch", "login", *(n["name"] for n in state["nodes"])]


def local_in_use() -> bool:
    """Whether any process on the machine, in any mount namespace, has a mount on /local."""
    seen: set[str | None] = set()
    for p in Path("/proc").iterdir():
        ns = mnt_ns(p.name) if p.name.isdigit() else None
        if ns is None or ns in seen:
            continue
        seen.add(ns)
        with contextlib.suppress(OSError):
            if any(
                line.split(" ")[4] == str(HOST_LOCAL) for line in (p / "mountinfo").read_text().splitlines()
            ):
                return True
    return False


# --- helpers ----------------------------------------------------------------------------------


def daemon_env(state: dict[str, Any]) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "LANG": "C.UTF-8",
        "SLURM_CONF": state["slurm_conf"],
        "VCLUSTER_NAME": state["name"],
    }


def start(state: dict[str, Any], key: str, argv: list[str], log: Path, **kw: Any) -> int:
    """Start a long-lived process in a session of its own and record its PID before anything else."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw
        )
    state["pids"][key] = proc.pid
    # our child until `up` ends, so its PID cannot be reused before the start time is read
    state.setdefault("starts", {})[key] = start_time(proc.pid)
    save_state(state)
    return proc.pid
