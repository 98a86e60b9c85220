"""Which node-local directory staging writes to, and removing the staging folders that killed runs
left there."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlhpc.common.fileio import atomic_write_text

LOCAL_DIR_VARIABLE = "MLHPC_LOCAL_DIR"
# Node-local scratch that schedulers and sites export, in order of preference.
_SCHEDULER_VARIABLES = ("SLURM_TMPDIR", "LOCAL_SCRATCH", "TMPDIR")


def resolve_local_dir(
    flag: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """The flag, else $MLHPC_LOCAL_DIR, else the scheduler's node-local temp dir, else the system temp dir."""
    env = os.environ if env is None else env
    if flag:
        return Path(flag)
    for name in (LOCAL_DIR_VARIABLE, *_SCHEDULER_VARIABLES):
        if env.get(name):
            return Path(env[name])
    return Path(tempfile.gettempdir())


# `mlhpc run` stages each seed into <local dir>/mlhpc-stage-<benchmark>-<uuid>/, whose first file is
# the owner marker: a folder is removed later only if it carries one (see remove_stale_stage_dirs).
STAGE_PREFIX = "mlhpc-stage-"
STAGE_OWNER = ".mlhpc_stage_owner.json"
log = logging.getLogger(__name__)


def claim_stage_dir(folder: Path, out: str | os.PathLike[str]) -> None:
    """Make `folder` and write its owner (host, boot, pid, the pid's start, --out) into it before
    anything else, so that after a SIGKILL the next run can prove the folder is mlhpc's and its
    owner gone."""
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    owner = {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "pid": pid,
        "start_ticks": _start_ticks(pid),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "out": str(Path(out).absolute()),
    }
    atomic_write_text(folder / STAGE_OWNER, json.dumps(owner) + "\n")


def remove_stale_stage_dirs(root: Path) -> list[Path]:
    """Remove the `mlhpc-stage-*` folders under `root` that killed runs left: only those with the
    owner marker, written on this host by a process that is gone (not alive, or its pid now
    belongs to a newer process, or the node rebooted since). A folder without a readable marker,
    from another host, or of a live process is never touched. Returns the folders removed."""
    removed: list[Path] = []
    try:
        candidates = sorted(
            p for p in Path(root).glob(f"{STAGE_PREFIX}*") if p.is_dir() and not p.is_symlink()
        )
    except OSError:
        return removed
    for folder in candidates:
        owner = _read_owner(folder / STAGE_OWNER)
        if owner is None or not _owner_gone(owner):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
            log.info("removed %s, left by pid %s (no longer running)", folder, owner["pid"])
    return removed


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int) or owner["pid"] <= 0:
        return None  # a pid of 0 or less would name a process group in os.kill
    return owner


def _owner_gone(owner: dict[str, Any]) -> bool:
    """Whether the process that wrote `owner` has surely ended; False whenever that is unsure."""
    if owner.get("host") != socket.gethostname():
        return False  # its pids mean nothing here
    boot = _boot_id()
    if boot and owner.get("boot_id") and owner["boot_id"] != boot:
        return True  # every process of an earlier boot has ended
    if owner.get("pid_namespace") != _pid_namespace():
        return False  # another container sharing the host name: its pids are not ours to look up
    pid = owner["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    # Alive: the same process only if it started at the same tick since boot (pids are reused).
    then, now = owner.get("start_ticks"), _start_ticks(pid)
    return then is not None and now is not None and then != now


def _pid_namespace() -> str | None:
    """This process's pid namespace ("pid:[4026531836]"), which containers may not share."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (Linux's /proc/<pid>/stat, field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
