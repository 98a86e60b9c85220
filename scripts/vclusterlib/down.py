"""`vcluster down`: end the cluster's processes (recorded ones and those in its hosts), remove
its proven state folder without crossing a mount, release the host's /local."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import VclusterError
from .procs import alive, holder_keys, local_in_use, members, mnt_ns, self_and_parents, send
from .state import HOST_DIR, HOST_LOCAL, LOCAL_MADE, check_root, locked, read_state, state_dir


def teardown(name: str) -> list[str]:
    """End every process of the cluster and remove its state, once the folder is proven its own;
    works on a half-made cluster and twice in a row. Returns what it could not do (empty when clean)."""
    sdir = state_dir(name)
    try:
        state = read_state(sdir)  # refuses, deleting and killing nothing, what vcluster did not make
    except FileNotFoundError:
        problems = []
    else:
        problems = end_processes(state) or remove_state_folder(sdir)
    release_host_local()
    return problems


def wait_gone(pids: list[int], proof: Callable[[int], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(proof(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def end_processes(state: dict[str, Any]) -> list[str]:
    """The daemons, then every process inside the cluster's hosts, then the hosts' holders.
    Only recorded processes (PID and start time) are the cluster's, and what runs in a host's mount
    namespace while its recorded holder lives in it (while it lives, its number is not reused);
    a command line naming the state folder proves nothing."""
    starts = state.get("starts", {})
    recorded = {key: (pid, starts.get(key)) for key, pid in state.get("pids", {}).items()}
    holders = {key: recorded[key] for key in holder_keys(state) if key in recorded}
    others = [v for key, v in recorded.items() if key not in holders]
    foreign = {mnt_ns("self"), mnt_ns(1), None}  # a holder not yet unshared is in the host's
    skip = self_and_parents() | {pid for pid, _ in holders.values()}

    def is_recorded(pid: int) -> bool:
        return any(alive(pid, start) for p, start in recorded.values() if p == pid)

    for pid, _ in others:
        send(pid, signal.SIGTERM, is_recorded)
    wait_gone([p for p, _ in others], is_recorded, 3)
    for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        namespaces = {mnt_ns(pid) for pid, start in holders.values() if alive(pid, start)} - foreign

        def inside(pid: int, namespaces: set[str | None] = namespaces) -> bool:
            return mnt_ns(pid) in namespaces

        targets = members(namespaces, skip)  # type: ignore[arg-type]
        for pid in targets:
            send(pid, sig, inside)
        for pid, _ in others:
            send(pid, sig, is_recorded)
        wait_gone(targets, inside, wait_s)
    namespaces = {mnt_ns(pid) for pid, start in holders.values() if alive(pid, start)} - foreign
    left = members(namespaces, skip) + [p for p, start in others if alive(p, start)]  # type: ignore[arg-type]
    if left:  # the holders stay: they are what proves these processes the cluster's next time
        return [f"processes {sorted(left)} did not end; run down again"]
    for pid, _ in holders.values():
        send(pid, signal.SIGKILL, is_recorded)
    wait_gone([p for p, _ in holders.values()], is_recorded, 5)
    left = [p for p, start in holders.values() if alive(p, start)]
    return [f"host processes {left} did not end; run down again"] if left else []


def mount_points_under(folder: Path) -> set[str]:
    """The mount points below `folder` in this mount namespace (mountinfo's octal escapes read)."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
        if point.startswith(f"{folder}/"):
            found.add(point)
    return found


def remove_state_folder(sdir: Path) -> list[str]:
    """Remove the proven state folder without leaving its file system. vcluster mounts nothing in
    the host's namespace (each mount it makes is inside a host's own namespace, gone with it), so
    a mount below the folder is someone's data: it stays, with all it holds. state.json goes
    last, so a folder not emptied stays provably vcluster's for the next `down`."""
    mounts = mount_points_under(sdir)
    kept: list[str] = []
    fd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        empty_folder(fd, sdir, os.fstat(fd).st_dev, mounts, kept, keep=frozenset({"state.json"}))
    except RecursionError:
        kept.append(f"{sdir} (nested too deep)")
    finally:
        os.close(fd)
    if kept:
        why = "not vcluster's to remove (a mount or another file system); unmount it, then run down again"
        return [f"left {', '.join(kept)}: {why}"]
    (sdir / "state.json").unlink()
    sdir.rmdir()
    return []


def empty_folder(
    fd: int, path: Path, dev: int, mounts: set[str], kept: list[str], keep: frozenset[str] = frozenset()
) -> bool:
    """Remove what folder `fd` holds, never following a link nor entering another file system
    or a mount point; what it could not remove goes into `kept`. True when it is empty."""
    emptied = True
    for name in os.listdir(fd):
        if name in keep:
            continue
        child = path / name
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=fd)
                continue
            if info.st_dev != dev or str(child) in mounts:
                kept.append(str(child))
                emptied = False
                continue
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                done = os.fstat(sub).st_dev == dev and empty_folder(sub, child, dev, mounts, kept)
            finally:
                os.close(sub)
            if done:
                os.rmdir(name, dir_fd=fd)
            else:
                emptied = False
        except OSError as e:  # a mount point on a file (EBUSY), or changed meanwhile
            kept.append(f"{child} ({e.strerror})")
            emptied = False
    return emptied


def release_host_local() -> None:
    """Remove the host's /local if vcluster made it and no process on the machine, of any
    cluster under any root, has a mount on it any more."""
    with locked(HOST_DIR):
        try:
            made = stat.S_ISREG(os.lstat(LOCAL_MADE).st_mode)
        except FileNotFoundError:
            return
        if not made or local_in_use():
            return
        with contextlib.suppress(OSError):  # not empty: someone put files there, leave it
            HOST_LOCAL.rmdir()
        if not os.path.lexists(HOST_LOCAL):
            LOCAL_MADE.unlink()


def cmd_down(args: argparse.Namespace) -> None:
    started = time.monotonic()
    existed = check_root(create=False) and os.path.lexists(state_dir(args.name))
    problems = teardown(args.name)
    if problems:
        raise VclusterError(f"down {args.name}: {'; '.join(problems)}")
    what = f"down in {time.monotonic() - started:.2f} s" if existed else "was not up (nothing to do)"
    print(f"vcluster: {args.name} {what}")
