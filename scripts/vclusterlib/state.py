"""The root and the state folder: proven vcluster's (root's alone, state.json naming its device
and inode) before anything is deleted or killed; the one lock per folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from .base import ROOT_RE, STATE_MAX_BYTES, VclusterError

ROOT = Path(os.environ.get("VCLUSTER_ROOT", "/run/vcluster"))
HOST_LOCAL = Path("/local")
# /local is the host's, not one cluster's (clusters under other roots mount it too): the note that
# vcluster made it, and the lock ordering its making (`up`, until its nodes mounted it) against its
# removal (the last `down` of any root), live in one host-wide place
HOST_DIR = Path("/run")
LOCAL_MADE = HOST_DIR / "vcluster-made-local"


def trust_problem(info: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why a folder (lstat) could be changed by someone other than root, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != 0:
        return f"belongs to uid {info.st_uid}, not root"
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        return "may be written by others"
    return None


def check_root(*, create: bool) -> bool:
    """Whether VCLUSTER_ROOT exists, after proving that only root can change what its path names:
    every folder from / down is root's, no link (lstat), none writable by others (a sticky /tmp
    is fine above the root). So the path cannot be redirected after this check either."""
    raw = str(ROOT)
    if not ROOT_RE.fullmatch(os.environ.get("VCLUSTER_ROOT", raw)):
        raise VclusterError(
            f"VCLUSTER_ROOT={os.environ.get('VCLUSTER_ROOT')}: give an absolute path of letters, digits, "
            "'.', '_' and '-' (no '..' part, no trailing '/'), e.g. /run/vcluster"
        )
    parts = ROOT.parts
    for i in range(1, len(parts) + 1):
        path, last = Path(*parts[:i]), i == len(parts)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if not last:
                raise VclusterError(
                    f"VCLUSTER_ROOT={raw}: {path} does not exist; make it or pick another"
                ) from None
            if not create:
                return False
            os.mkdir(path, 0o755)
            os.chmod(path, 0o755)  # munged (user munge) walks through to its socket; nobody else writes
            info = os.lstat(path)
        problem = trust_problem(info, sticky_ok=not last)
        if problem:
            raise VclusterError(
                f"VCLUSTER_ROOT={raw}: {path} {problem}; use a folder that root alone can change, all the way up"
            )
    return True


def root() -> Path:
    """VCLUSTER_ROOT (read here, at call time, so the tests can point it elsewhere)."""
    return ROOT


def state_dir(name: str) -> Path:
    return ROOT / name


def read_state(sdir: Path) -> dict[str, Any]:
    """The state of the cluster whose folder is `sdir`, once proven vcluster's: a real folder of
    root's alone whose state.json, a regular file of root's, names this folder and records its
    device and inode. Anything else is refused and left alone. FileNotFoundError: no folder."""

    def refused(why: str) -> VclusterError:
        return VclusterError(
            f"{sdir} is not a state folder of vcluster ({why}); vcluster leaves it alone: "
            f"look at it and move it away, or pick another --name"
        )

    info = os.lstat(sdir)
    problem = trust_problem(info, sticky_ok=False)
    if problem:
        raise refused(problem)
    try:  # no link followed, no FIFO waited on
        fd = os.open(sdir / "state.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise refused(f"no state.json: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise refused("its state.json is not a file of root's alone")
        data = f.read(STATE_MAX_BYTES + 1)
    try:
        state = json.loads(data) if len(data) <= STATE_MAX_BYTES else None
    except ValueError:
        state = None
    proof = {"tool": "vcluster", "state_dir": str(sdir), "folder": [info.st_dev, info.st_ino]}
    if not isinstance(state, dict) or any(state.get(k) != v for k, v in proof.items()):
        raise refused("its state.json was not written by vcluster for this folder")
    return state


def load_state(name: str) -> dict[str, Any]:
    sdir = state_dir(name)
    try:
        return read_state(sdir)
    except FileNotFoundError:
        raise VclusterError(
            f"no cluster '{name}' ({sdir} does not exist); start one: scripts/vcluster up --name {name}"
        ) from None


def save_state(state: dict[str, Any]) -> None:
    path = Path(state["state_dir"]) / "state.json"
    tmp = path.with_name("state.json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a crash leaves the old or the new state, never half of one


@contextlib.contextmanager
def locked(path: Path) -> Any:
    """An exclusive flock on a folder: one `up`/`down` at a time touches the shared parts."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
