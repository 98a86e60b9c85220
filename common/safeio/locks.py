"""One writer per folder: a lock file that a second `mlhpc` process finds held and refuses at once.

The lock is a POSIX record lock (`fcntl.lockf`) on `<folder>/.mlhpc.lock`, which NFS and Lustre
pass between nodes and the kernel drops when its holder dies: a lock file left by a killed
process is stale by construction and is simply taken again. The holder writes its host, pid and
start time into the file, so the refusal names who holds it. The file itself stays (removing a
lock file races with the next taker); it starts with `.mlhpc`, which dataset listings skip.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlhpc.common.errors import MlhpcError
from mlhpc.common.printable import shown
from mlhpc.common.safeio import safe_json

LOCK_NAME = ".mlhpc.lock"


class FolderBusy(MlhpcError):
    """Another process holds the folder's lock."""


@contextmanager
def folder_lock(folder: Path, what: str, fix: str, wait_s: float = 0.0) -> Iterator[Path]:
    """Hold `folder`'s lock for the `with` block (making `folder` if needed), saying `what` this
    process does there. A lock held by another process is waited for up to `wait_s` (0: not at all),
    then is a `FolderBusy` naming the holder, its `what`, and `fix`. Within one process POSIX locks
    do not exclude each other, so take each folder's lock once per process."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # no link, no wait
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        raise MlhpcError(
            f"cannot lock {folder} ({e.strerror or e}); check that it is a writable folder"
        ) from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted under the name
            raise MlhpcError(f"{shown(path)} is not a regular file; move it away (mlhpc makes its own)")
        waited_until = time.monotonic() + wait_s
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise MlhpcError(f"cannot lock {path} ({e.strerror}); check the file system") from e
                if time.monotonic() >= waited_until:
                    raise FolderBusy(f"{folder} is in use by {_holder(fd)}; {fix}") from None
                time.sleep(0.2)
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), "what": what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the only descriptor drops the lock


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it ("another process" when the file does not say it
    in the shape mlhpc writes: anyone who can write the folder can write this file)."""
    try:
        data = safe_json.loads(os.pread(fd, 4096, 0) or b"{}", dict)
        pid, host, what, since = data["pid"], data["host"], data["what"], data["since"]
        texts = isinstance(host, str) and isinstance(what, str)
        if type(pid) is not int or not 0 < pid <= 2**22 or not texts:
            return "another process"
        if type(since) not in (int, float) or not 0 <= since < 2**35:  # finite, before the year 3000
            return "another process"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        return f"pid {pid} on {shown(host[:200])} ({shown(what[:200])}) since {stamp}"
    except (OSError, ValueError, KeyError, OverflowError):
        return "another process"
