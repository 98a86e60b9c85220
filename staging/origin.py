"""A source file's identity, and opening a file without blocking on a FIFO or a device.

Staging records, for every copy, what its source file was when it was copied (`identity`: size,
mtime, ctime, inode and device); a rerun keeps a copy only when its source's identity is still
the recorded one (and its manifest checksum, where the source has one, still the one it was
copied against). Writing a file moves its mtime and ctime; setting the mtime back (`touch -d`)
moves the ctime, which no user can set: without a manifest, a file changed in place is caught
unless the system clock was set back or the disk was written below the file system. Where that
evidence is weak (`weak_evidence`: FUSE, such as sshfs, or whole-second timestamps) no identity
is recorded, so a rerun keeps a copy only on its manifest's checksum and else copies it again.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from mlhpc.common.errors import StagingError

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def identity(info: os.stat_result) -> str:
    """A file's identity as staging records it: size, mtime and ctime (ns), inode, device."""
    return f"{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}:{info.st_dev}"


RACY_NS = 100_000_000
"""A file changed less than this before it was copied may change again within the same tick of
a coarse file-system clock without its timestamps moving (git calls such index entries racy):
its copy records no identity, so a rerun copies it again (or keeps it on a manifest's checksum)."""
RACY_WHOLE_SECOND_NS = 2_000_000_000
"""The same for a file system that keeps whole seconds (ns part 0) or two (FAT)."""


def recorded_identity(info: os.stat_result) -> str:
    """The identity a copy records for a source stat'ed as `info` when it was opened: "" when the
    file changed so recently that a further change might not move its timestamps (`RACY_NS`), or
    when its file system cannot prove it unchanged (`weak_evidence`)."""
    if weak_evidence(info) is not None:
        return ""
    latest = max(info.st_mtime_ns, info.st_ctime_ns)
    window = RACY_WHOLE_SECOND_NS if latest % 1_000_000_000 == 0 else RACY_NS
    return "" if time.time_ns() - latest < window else identity(info)


def current_identity(path: str | os.PathLike[str]) -> str:
    """`path`'s identity now (links followed), "" when it cannot be stat'ed or is not a regular file."""
    try:
        info = os.stat(path)
    except OSError:
        return ""
    return identity(info) if stat.S_ISREG(info.st_mode) else ""


# ---------------------------------------------------------------- when identity proves nothing
# sshfs (any FUSE file system) reports the ctime the server chooses (SFTP has none: sshfs shows
# the mtime, which a user sets back with `touch -d`) and inode numbers FUSE makes up; a file
# system of whole-second timestamps cannot tell two writes in one second apart. There a file can
# be changed and its size, timestamps and inode put back: they are no evidence of its content.
# FUSE is told by the mount table (type `fuse`, `fuse.<name>` or `fuseblk`: statfs's f_type
# 0x65735546, which Python's os does not give).
_FS_TYPES: dict[int, str] = {}


def _fs_type(dev: int) -> str:
    """The type of the mounted file system of device `dev` ("" when unknown), from the kernel's
    mount table, read again only for a device not seen before (one read per staging, not per file)."""
    if dev not in _FS_TYPES:
        try:
            table = Path("/proc/self/mountinfo").read_text(errors="replace")
        except OSError:
            table = ""
        for line in table.splitlines():
            fields, _, rest = line.partition(" - ")
            parts = fields.split()
            if len(parts) > 2 and rest and ":" in parts[2]:
                major, _, minor = parts[2].partition(":")
                if major.isdigit() and minor.isdigit():
                    _FS_TYPES.setdefault(os.makedev(int(major), int(minor)), rest.split()[0])
        _FS_TYPES.setdefault(dev, "")
    return _FS_TYPES[dev]


def weak_evidence(info: os.stat_result) -> str | None:
    """Why the size, timestamps and inode of a file stat'ed as `info` cannot prove it unchanged
    (a FUSE file system such as sshfs, or whole-second timestamps); None when they can."""
    fs_type = _fs_type(info.st_dev)
    if fs_type == "fuse" or fs_type.startswith(("fuse.", "fuseblk")):
        return f"it is on a FUSE file system ({fs_type}), whose ctime and inode numbers its server chooses"
    if info.st_mtime_ns % 1_000_000_000 == 0 and info.st_ctime_ns % 1_000_000_000 == 0:
        return "its file system keeps whole-second timestamps"
    return None


def kind_of(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def not_regular(path: str | os.PathLike[str], mode: int, fix: str) -> StagingError:
    return StagingError(f"{path} is {kind_of(mode)}, not a regular file; refused without reading it: {fix}")


SOURCE_FIX = "move it out of the dataset (staging reads regular files only)"


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, fix: str = SOURCE_FIX) -> int:
    """Open a regular file for reading, never blocking: its type is judged by `stat` before the
    open (a device is not even opened), the open is non-blocking (a name swapped for a FIFO in
    between returns at once) and the open descriptor is judged again. Raises OSError when it
    cannot be opened, StagingError (naming it and `fix`) when it is not a regular file."""
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        raise not_regular(path, before.st_mode, fix)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode, fix)
        os.set_blocking(fd, True)  # a regular file ignores the flag; what reads it need not know
    except BaseException:
        os.close(fd)
        raise
    return fd


def changed_while_copied(path: str, before: os.stat_result, fd: int) -> StagingError | None:
    """An error if the open file `fd` (stat'ed as `before` when opened) was written while it was
    copied: its size, mtime or ctime moved."""
    after = os.fstat(fd)
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ctime_ns,
    ):
        return None
    return StagingError(
        f"staging source file {path} changed while it was copied; stop what writes it and stage again"
    )
