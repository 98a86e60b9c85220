"""The source seam: every read of SRC goes through here.

`Source` is one dataset root as staging (and a trainer reading samples not staged yet) sees it:
opening a file without blocking (`open_source`: a FIFO or device is refused, never waited on),
reading one whole and checking it against its manifest entry (`read`), a file's identity (the
evidence a restage relies on), and how much of it the page cache holds (`cached_fraction`). Its
listing is the manifest (`manifest.py`, which hashes through `open_source`), and a rank's share
of it the pure planner's (`plan.rank_files`).

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

import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

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


def open_source(path: str | os.PathLike[str], flags: int = os.O_RDONLY, fix: str = SOURCE_FIX) -> int:
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


def source_error(e: OSError, path: str | os.PathLike[str]) -> StagingError:
    if e.errno == errno.ENOENT:
        return StagingError(f"staging source file {path} is missing; restore it or regenerate the dataset")
    return StagingError(
        f"cannot read staging source file {path} ({e.strerror}); check it and its permissions"
    )


class Source:
    """One dataset root, read the one way: judged, non-blocking opens; whole-file reads checked
    against the manifest's entry; identities as a restage records them."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def open(self, rel: str) -> int:
        """A descriptor on `rel` (a regular file, never waited on); the error names the file."""
        try:
            return open_source(self.path(rel))
        except OSError as e:
            raise source_error(e, self.path(rel)) from e

    def identity(self, rel: str) -> str:
        return current_identity(self.path(rel))

    def read(self, entry: Any, algorithm: str) -> bytes:
        """`entry`'s file whole, checked against its size and (where the manifest has one) its
        checksum: a sample read from SRC is held to what its staged copy would be."""
        fd = self.open(entry.path)
        try:
            with open(fd, "rb", closefd=False) as handle:
                data = handle.read(entry.size + 1)
        except OSError as e:
            raise source_error(e, self.path(entry.path)) from e
        finally:
            os.close(fd)
        if len(data) != entry.size:
            raise StagingError(
                f"staging source file {self.path(entry.path)} has {len(data)} bytes, its listing says "
                f"{entry.size}; the source changed: stage again"
            )
        if entry.checksum and _digest(data, algorithm) != entry.checksum:
            raise StagingError(
                f"staging source file {self.path(entry.path)} fails its {algorithm} check against "
                "the manifest; the source changed since it was written: stage again"
            )
        return data

    def cached_fraction(self, rels: Sequence[str], sample: int = 64) -> float:
        """The fraction of the bytes of up to `sample` of `rels` (spread over the list) that is in
        the page cache (`mincore`, which touches no page)."""
        if not rels:
            return 0.0
        step = max(1, len(rels) // sample)
        resident = total = 0
        for rel in rels[::step][:sample]:
            r, s = resident_bytes(self.path(rel))
            resident, total = resident + r, total + s
        return resident / total if total else 0.0


HASH_ALGORITHMS = ("xxh3_128", "sha256")


def new_hasher(algorithm: str) -> Any:
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise StagingError(f"unknown checksum algorithm {algorithm!r}; use one of {HASH_ALGORITHMS}")


def _digest(data: bytes, algorithm: str) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return str(hasher.hexdigest())


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = libc
    return _libc


_LOW_BIT = bytes(i & 1 for i in range(256))


def resident_bytes(path: str) -> tuple[int, int]:
    """(bytes of `path` in the page cache, its size), from `mincore` on a mapping of it, which
    touches no page. (0, size) where it cannot tell."""
    try:  # judged first and opened non-blocking: a FIFO or device is never waited on (the copy refuses it)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return 0, 0
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return 0, 0
    try:
        info = os.fstat(fd)
        size = info.st_size
        if size == 0 or not stat.S_ISREG(info.st_mode):
            return 0, 0
        libc = _c()
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0, size
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return 0, size
            resident = pages - bytes(vec).translate(_LOW_BIT).count(0)
        finally:
            libc.munmap(addr, size)
        return min(size, resident * mmap.PAGESIZE), size
    except (OSError, AttributeError):
        return 0, 0
    finally:
        os.close(fd)
