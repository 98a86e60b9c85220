"""Which node-local directory staging writes to, claiming a folder there with an owner marker, and
removing such folders (a run's own at its end, those killed runs left) so that no signal can
leave one behind that a later run cannot prove is ours."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlhpc.common.cluster.termination import signals_held
from mlhpc.common.printable import shown
from mlhpc.common.safeio import safe_json
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.safe_read import read_bytes_stat

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


OWNER_MAX_BYTES = 64 * 1024
"""Far more than the marker mlhpc writes (a few hundred bytes); a bigger one is not ours."""
PID_MAX = 2**22
"""Linux's PID_MAX_LIMIT: no process has a larger pid."""


CLAIMING_SUFFIX = ".claiming"
"""A folder being claimed: made under this name, marked, then renamed to its own (claim_stage_dir)."""
TRASH_SUFFIX = ".trash"
"""A claimed folder being removed is first renamed `<name>.trash`: one atomic step that says "its
owner is done with it", so that a later run finishes the removal even if its pid lives on."""


def claim_stage_dir(folder: Path, out: str | os.PathLike[str]) -> None:
    """Make `folder` and write its owner (user, host, boot, pid, the pid's start, --out) into it
    before anything else, so that after a SIGKILL the next run can prove the folder is mlhpc's
    and its owner gone. `mlhpc stage-bench` claims its folders the same way. A new folder is made
    as `<name>.claiming` with the marker inside and then renamed: a SIGKILL between a plain mkdir
    and the marker left an unmarked folder that no later run could prove ours."""
    pid = os.getpid()
    owner = {
        "uid": os.getuid(),
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "pid": pid,
        "start_ticks": _start_ticks(pid),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "out": str(Path(out).absolute()),
    }
    text = json.dumps(owner) + "\n"
    if folder.is_dir():  # made by the caller (stage-bench's marked folders): marked in place
        atomic_write_text(folder / STAGE_OWNER, text)
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    claiming = folder.with_name(folder.name + CLAIMING_SUFFIX)
    for _ in range(3):
        claiming.mkdir(exist_ok=True)
        try:
            atomic_write_text(claiming / STAGE_OWNER, text)
        except FileNotFoundError:  # another run's sweep removed it while it was empty: again
            continue
        os.rename(claiming, folder)
        return
    raise OSError(f"cannot claim {folder}: its folder kept disappearing")


def remove_claimed_dir(folder: Path) -> bool:
    """Remove a folder that `claim_stage_dir` claimed, in steps no signal can leave unprovable:
    renamed to `<name>.trash` beside it (atomic, with Ctrl-C, SIGTERM and SIGHUP held), then
    emptied with the owner marker last. A second signal or a SIGKILL at any point leaves either
    nothing or a folder still carrying its marker, which the next `remove_stale_stage_dirs`
    finishes. True when the folder is gone."""
    trash = folder if folder.name.endswith(TRASH_SUFFIX) else folder.with_name(folder.name + TRASH_SUFFIX)
    if trash != folder:
        with signals_held():
            try:
                os.rename(folder, trash)
            except FileNotFoundError:
                return True
            except OSError:  # a busy mount point, a trash name taken: removed in place, marker last
                trash = folder
    return _remove_marker_last(trash)


def _remove_marker_last(folder: Path) -> bool:
    """Everything in `folder` but the owner marker, then (only if all of that went) the marker and
    the folder: shutil.rmtree removes in listing order, the marker often first, and a signal
    then left gigabytes no one could prove were ours."""
    try:
        entries = _entries_but_marker(folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
    try:
        if _entries_but_marker(folder):
            return False  # something could not go: the marker stays, to prove the rest is ours
        # Held: a second stop rarely falls between the two (never, in a process of one thread); what
        # it or a SIGKILL leaves there is an emptied .trash folder, which the sweep rmdirs.
        with signals_held():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / STAGE_OWNER)
            os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _entries_but_marker(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as listing:
        return [entry for entry in listing if entry.name != STAGE_OWNER]


def remove_stale_stage_dirs(root: Path, prefix: str = STAGE_PREFIX) -> list[Path]:
    """Remove the `mlhpc-stage-*` (or `prefix`*) folders under `root` that killed runs left: only
    this user's folders (not links) holding this user's owner marker, written on this host by a
    process that is gone (not alive, or its pid now belongs to a newer process, or the node
    rebooted since), or renamed to `*.trash` by an owner that was removing it. The node-local
    folder is shared by every user of a node, so whatever cannot be proven ours and stale is left
    alone: another user's, unmarked, from another host, of a live process, or a marker mlhpc
    cannot read (a warning). Returns the folders removed."""
    removed: list[Path] = []
    for folder in _stage_folders(Path(root), prefix):
        trash = folder.name.endswith(TRASH_SUFFIX)
        owner = _read_owner(folder / STAGE_OWNER)
        if owner is None:
            # trash: the marker went last; claiming: a claim killed before its marker (with, at
            # most, the marker's own temporary). Either way rmdir only: it removes nothing else.
            if folder.name.endswith(CLAIMING_SUFFIX):
                _remove_dead_marker_temporaries(folder)
            if trash or folder.name.endswith(CLAIMING_SUFFIX):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            continue
        if not (_owner_gone(owner) or (trash and owner["host"] == socket.gethostname())):
            continue
        if remove_claimed_dir(folder):
            removed.append(folder)
            log.info("removed %s, left by pid %s", shown(folder), owner["pid"])
    return removed


def _remove_dead_marker_temporaries(claiming: Path) -> None:
    """Remove the marker temporaries (`.mlhpc_stage_owner.json.*.tmp`, atomic_write_text's) that
    a claim killed inside its write left in an unmarked `.claiming` folder: this user's small
    plain files, either empty (killed before its one write) or naming an owner that is gone.
    Anything else in the folder keeps it. A live claim whose empty temporary goes with it fails
    its rename and claims again (claim_stage_dir tries three times)."""
    prefix, suffix = STAGE_OWNER + ".", ".tmp"
    try:
        with os.scandir(claiming) as listing:
            temporaries = [e for e in listing if e.name.startswith(prefix) and e.name.endswith(suffix)]
    except OSError:
        return
    for entry in temporaries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone already
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            continue
        if info.st_size:  # whole (one write): read as the marker it was to become
            owner = _read_owner(Path(entry.path))
            if owner is None or not _owner_gone(owner):
                continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)


def _stage_folders(root: Path, prefix: str = STAGE_PREFIX) -> list[Path]:
    """The folders named `prefix`* directly under `root` that this user owns (no links)."""
    found = []
    try:
        with os.scandir(root) as listing:
            for entry in listing:
                try:
                    if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                        continue
                    if entry.stat(follow_symlinks=False).st_uid == os.getuid():
                        found.append(Path(entry.path))
                except OSError:
                    continue
    except OSError:
        return []
    return sorted(found)


class _NotOurs(ValueError):
    """The marker does not prove an owner: why, for the warning."""


def _read_owner(path: Path) -> dict[str, Any] | None:
    """The marker's owner, or None when it does not prove one: missing (silently: a run may be
    between making its folder and claiming it), or unreadable, malformed or another user's file
    (with a warning: mlhpc leaves it alone)."""
    try:
        data, info = read_bytes_stat(path, OWNER_MAX_BYTES, what="a staging owner file", follow=False)
        if info.st_uid != os.getuid():
            raise _NotOurs(f"owned by uid {info.st_uid}, not this user")
        return _checked_owner(safe_json.loads(data, dict), info.st_uid)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        log.warning("%s: %s; left alone (remove its folder yourself if no run uses it)", shown(path), why)
        return None


def _checked_owner(owner: dict[str, Any], file_uid: int) -> dict[str, Any]:
    """`owner` if every field `_owner_gone` reads has its type and range; _NotOurs otherwise."""
    pid = owner.get("pid")
    if type(pid) is not int or not 0 < pid <= PID_MAX:  # 0 or less would name a process group
        raise _NotOurs(f"pid {str(pid)[:40]} is not a process id")
    if "uid" in owner and (type(owner["uid"]) is not int or owner["uid"] != file_uid):
        raise _NotOurs(f"uid {str(owner['uid'])[:40]} is not the file's owner")
    if not isinstance(owner.get("host"), str):
        raise _NotOurs("no host name")
    for key in ("boot_id", "pid_namespace"):
        if owner.get(key) is not None and not isinstance(owner[key], str):
            raise _NotOurs(f"{key} is not text")
    ticks = owner.get("start_ticks")
    if ticks is not None and (type(ticks) is not int or not 0 <= ticks < 2**63):
        raise _NotOurs(f"start_ticks {str(ticks)[:40]} is not a clock tick count")
    return owner


def _owner_gone(owner: dict[str, Any]) -> bool:
    """Whether the process that wrote `owner` (checked by `_checked_owner`) has surely ended;
    False whenever that is unsure."""
    if owner["host"] != socket.gethostname():
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
        line = Path(f"/proc/{pid}/stat").read_text()
        return int(line.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
