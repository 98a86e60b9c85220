"""Which I/O path one staging job takes: through the page cache or around it (O_DIRECT).

Chosen per job on facts (`choose_io`): how much this node writes against the memory it may use
(the machine's and its memory cgroup's), and how much of the source is cached already (`mincore`
on a sample of its files), and whether O_DIRECT writes work and pay in DEST
(`direct_writes_pay`). Pure policy in `decide`, the probes beside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.vocabulary import IO_CHOICES
from mlhpc.staging.sink import ALIGN

FIT_FRACTION = 0.5
"""A node's share "fits" when it is at most this fraction of the memory it may use: the copy,
the trainer and the source's pages all want room in the page cache."""
CACHED_FRACTION = 0.9
"""The share of the sampled source bytes that must be in the page cache for the source to count
as cached (a dataset just generated, or staged a moment ago)."""
SAMPLE_FILES = 64
"""Source files `mincore` looks at: spread over the list, whole files."""


@dataclass(frozen=True)
class IoPlan:
    """The I/O path of one job, and why."""

    direct_reads: bool
    """Read the source with O_DIRECT (large files; where the file system allows it)."""
    direct_writes: bool
    """Write node-local copies with O_DIRECT."""
    reason: str
    cached: float = 0.0
    """The fraction of the sampled source bytes found in the page cache."""
    available_bytes: int | None = None
    """The memory this node may use (None: unknown); the direct path sizes its buffers by it."""
    kernel_copy: bool = False
    """Buffered, with large files copied in the kernel and hashed from the copy's pages
    (`buffered.copy_kernel`); only when forced (`--io kernel`)."""

    @property
    def source_cached(self) -> bool:
        return self.cached >= CACHED_FRACTION

    @property
    def label(self) -> str:
        if self.kernel_copy:
            return "buffered, kernel copy"
        if self.direct_reads == self.direct_writes:
            return "direct" if self.direct_reads else "buffered"
        return "direct reads, buffered writes" if self.direct_reads else "buffered reads, direct writes"

    def metadata(self) -> dict[str, str]:
        return {"staging_io": self.label, "staging_io_reason": self.reason}


def decide(io: str, share_bytes: int, available_bytes: int | None, cached: float, direct_ok: bool) -> IoPlan:
    """The policy: `io` forced, or (auto) buffered when the share fits well within the memory
    this node may use or the source is cached already, O_DIRECT when neither.

    `available_bytes`: None when not known (then only a cached source takes the buffered path);
    `cached`: the cached fraction of the sampled source bytes; `direct_ok`: whether O_DIRECT
    writes work and pay in DEST (`direct_writes_pay`)."""
    if io not in IO_CHOICES:
        raise StagingError(f"io={io!r} is unknown; use one of {', '.join(IO_CHOICES)}")
    mib = 1 << 20
    room = "unknown" if available_bytes is None else f"{available_bytes // mib} MiB"
    facts = f"share {share_bytes // mib} MiB, memory available {room}, source {cached:.0%} cached"
    if io in ("buffered", "kernel"):
        return IoPlan(False, False, f"--io {io} ({facts})", cached, available_bytes, io == "kernel")
    if io == "direct":
        refused = "" if direct_ok else "; DEST takes no O_DIRECT"
        return IoPlan(True, direct_ok, f"--io direct ({facts}){refused}", cached, available_bytes)
    fits = available_bytes is not None and share_bytes <= FIT_FRACTION * available_bytes
    if fits or cached >= CACHED_FRACTION:
        why = "share fits in memory" if fits else "source already in page cache"
        return IoPlan(False, False, f"auto: {why} ({facts})", cached, available_bytes)
    return IoPlan(
        True, direct_ok, f"auto: share larger than memory allows ({facts})", cached, available_bytes
    )


def available_memory() -> int | None:
    """Bytes this process may fill with page cache: the machine's MemAvailable, less where a
    memory cgroup (v1 or v2, this one or an ancestor) allows less. None when unknown."""
    found = [meminfo_available(Path("/proc/meminfo"))]
    found += cgroup_room(Path("/proc/self/cgroup"), Path("/sys/fs/cgroup"))
    known = [n for n in found if n is not None]
    return min(known) if known else None


def meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_room(self_cgroup: Path, root: Path) -> list[int]:
    """Room left under every memory limit on this process's cgroup path: limit less usage,
    with the reclaimable inactive file pages counted as room."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # v2
            folder, names = root / parts[2].lstrip("/"), ("memory.max", "memory.current", "inactive_file")
        elif "memory" in parts[1].split(","):  # v1
            base = root / "memory"
            folder = base / parts[2].lstrip("/")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        while True:
            if (room := _room(folder, *names)) is not None:
                rooms.append(room)
            if folder == root or folder.parent == folder or not str(folder).startswith(str(root)):
                break
            folder = folder.parent
    return rooms


def _room(folder: Path, limit_name: str, usage_name: str, inactive_name: str) -> int | None:
    try:
        limit_text = (folder / limit_name).read_text().strip()
        if limit_text == "max" or int(limit_text) >= 1 << 60:  # v1 "no limit" is a huge number
            return None
        usage = int((folder / usage_name).read_text())
        inactive = 0
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_name:
                inactive = int(value)
        return max(0, int(limit_text) - usage + inactive)
    except (OSError, ValueError):
        return None


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = libc
    return _libc


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


_LOW_BIT = bytes(i & 1 for i in range(256))


def cached_fraction(paths: Sequence[str], sample: int = SAMPLE_FILES) -> float:
    """The fraction of the bytes of up to `sample` of `paths` (spread over the list) that is in
    the page cache."""
    if not paths:
        return 0.0
    step = max(1, len(paths) // sample)
    resident = total = 0
    for path in paths[::step][:sample]:
        r, s = resident_bytes(path)
        resident, total = resident + r, total + s
    return resident / total if total else 0.0


def choose_io(io: str, share_bytes: int, source_paths: Sequence[str], direct_ok: bool) -> IoPlan:
    """`decide` on this machine's facts. With `io` forced, the probes still run: the reason
    shows what auto would have seen."""
    return decide(io, share_bytes, available_memory(), cached_fraction(source_paths), direct_ok)


def supports_direct_io(directory: str) -> bool:
    """Whether O_DIRECT writes work in `directory` (not on tmpfs of older kernels, not on some FUSE)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = os.path.join(directory, f".mlhpc-direct-probe-{os.getpid()}")
    buffer = mmap.mmap(-1, ALIGN)
    made = False
    try:
        # O_EXCL: a file of that name that is there already (a user's) is neither written nor removed.
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_DIRECT, 0o644)
        made = True
        try:
            os.pwrite(fd, buffer, 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        buffer.close()
        if made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(probe)


MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def direct_writes_pay(directory: str) -> bool:
    """Whether to write staged files into `directory` with O_DIRECT: where it works and the disk
    reads the bytes itself. Not on a memory file system (/dev/shm), which accepts O_DIRECT on
    Linux >= 6.6 but copies the bytes in the kernel all the same: there, buffered writes in
    slices let each slice be hashed and copied while cached (`FileSink._hash_and_write`)."""
    return filesystem_type(directory) not in MEMORY_FILESYSTEMS and supports_direct_io(directory)


def filesystem_type(directory: str) -> str:
    """The type of the file system that holds `directory` (from /proc/self/mounts; "" without it)."""
    path = os.path.realpath(directory)
    found, kind = "", ""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(found):  # the longest, and the last of equals
                    found, kind = point, fields[2]
    except OSError:
        return ""
    return kind
