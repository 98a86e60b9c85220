"""Buffered copies through the page cache: each slice of a file is read, hashed and written once.

The path of a job whose share fits in memory or whose source is cached (`iopath`). The bytes
pass through one small buffer per thread: read (from the source's page cache, or the disk),
hashed while they are in the CPU's cache, written (into the destination's page cache, where the
trainer's first epoch finds them). The checksum is of the very bytes written, and it is checked
against the manifest before the copy gets its name: a file smaller than a slice is verified
before anything is written at all.

`copy_kernel` is the other way, for large files (`--io kernel`): the kernel copies
(`copy_file_range`, else `sendfile`) and the copy's own pages are hashed through a read-only
mapping, so no byte passes through a user-space buffer. Measured here it costs more CPU than
the read-hash-write path (mapping and unmapping the pages costs about what the copy to user
space does, perf/RESULTS.md), so `auto` does not take it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import landing
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, new_hasher
from mlhpc.staging.origin import changed_while_copied, open_regular, recorded_identity
from mlhpc.staging.sink import FILE_MODE_BITS, Staged, checked_dirs, partial_name, write_error

SLICE_BYTES = 1 << 20
"""One read, hash and write: fits a core's L2 cache with room, so the hash and the write's copy
read the bytes from cache; a file up to this size is one read and one write."""
KERNEL_SLICE_BYTES = 8 << 20
"""One kernel copy, then the hash of its pages (a multiple of the mapping granularity)."""
KERNEL_COPY_MIN_BYTES = 8 << 20
"""Smaller files go the read-hash-write path also under `--io kernel`: a mapping per file costs
more than the one read and write they take."""
_READ = os.O_RDONLY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW  # new: nobody's file, no link
_READ_WRITE = _WRITE & ~os.O_WRONLY | os.O_RDWR  # the kernel copy maps what it wrote, to hash it
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
"""copy_file_range refused (another file system, an old kernel): `sendfile` does it."""
_LINK_FIX = "remove the link from DEST, or stage into a new folder"
_local = threading.local()


def _buffer() -> memoryview:
    """This thread's slice buffer (one more byte: a whole-file read shows the file's end)."""
    view = getattr(_local, "view", None)
    if view is None:
        buffer = mmap.mmap(-1, SLICE_BYTES + mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = _local.view = memoryview(buffer)
    return view


def source_error(e: OSError, path: str) -> StagingError:
    if e.errno == errno.ENOENT:
        return StagingError(f"staging source file {path} is missing; restore it or regenerate the dataset")
    return StagingError(
        f"cannot read staging source file {path} ({e.strerror}); check it and its permissions"
    )


def changed(path: str, got: int, listed: int) -> StagingError:
    return StagingError(
        f"staging source file {path} gave {got} bytes, its listing says {listed}; the source "
        f"changed: regenerate its {MANIFEST_NAME} or stage again"
    )


def mismatch(entry: FileEntry, algorithm: str) -> StagingError:
    return StagingError(
        f"staged copy of {entry.path} fails its {algorithm} check: the source changed since its "
        f"{MANIFEST_NAME} was written (or was corrupted in transit); stage again"
    )


def copy_buffered(
    src_root: str,
    dest_root: str,
    entry: FileEntry,
    algorithm: str,
    umask: int | None,
    check: Callable[[], None] = lambda: None,
    token: str = "",
) -> Staged:
    """Copy one file through the page cache, verified against `entry` before it is renamed.

    The source is read in slices until a short read reaches the listed size (a file that grew
    reads on and is caught, as is one that shrank); its mode is kept (less setuid, setgid,
    sticky). `check` runs before each slice after the first, and raises to stop the copy."""
    source = os.path.join(src_root, entry.path)
    view = _buffer()
    fd = _open_source(source)
    try:
        try:
            info = os.fstat(fd)
            n = os.readv(fd, [view[: min(entry.size + 1, SLICE_BYTES)]])
        except OSError as e:
            raise source_error(e, source) from e
        hasher = new_hasher(algorithm)
        hasher.update(view[:n])
        if n <= entry.size < SLICE_BYTES:  # the whole file is in: verify before writing anything
            _verified(entry, algorithm, hasher, n)
        with _Partial(dest_root, entry, token, info.st_mode & FILE_MODE_BITS) as partial:
            received = n
            while n:
                _write_all(partial.fd, view[:n], partial.target)
                if received >= entry.size and n < SLICE_BYTES:
                    break  # a short read that reaches the listed size: the end (a grown file reads on)
                check()
                try:
                    n = os.readv(fd, [view[:SLICE_BYTES]])
                except OSError as e:
                    raise source_error(e, source) from e
                hasher.update(view[:n])
                received += n
            checksum = _verified(entry, algorithm, hasher, received)
            if (moved := changed_while_copied(source, info, fd)) is not None:
                raise moved
            partial.publish(umask)
        return Staged(entry.path, received, checksum, entry.path, checksum, recorded_identity(info))
    finally:
        os.close(fd)


def copy_kernel(
    src_root: str,
    dest_root: str,
    entry: FileEntry,
    algorithm: str,
    umask: int | None,
    check: Callable[[], None] = lambda: None,
    token: str = "",
) -> Staged:
    """Copy one file in the kernel, hash the copy's pages, verify against `entry`, then rename.

    The hash is of the copy, not of the source: what gets the name is what was checked, also
    if the source changes under the copy. A file whose size is not its listed one is refused
    before anything is written; one that shrinks or grows during the copy after it (the copy
    runs to the source's end). `check` runs before each slice after the first."""
    source = os.path.join(src_root, entry.path)
    fd = _open_source(source)
    try:
        try:
            info = os.fstat(fd)
        except OSError as e:
            raise source_error(e, source) from e
        if info.st_size != entry.size:
            raise changed(entry.path, info.st_size, entry.size)
        with _Partial(dest_root, entry, token, info.st_mode & FILE_MODE_BITS, _READ_WRITE) as partial:
            hasher = new_hasher(algorithm)
            copied = _copy_in_kernel(fd, partial, entry.size, hasher, check, source)
            checksum = _verified(entry, algorithm, hasher, copied)
            if (moved := changed_while_copied(source, info, fd)) is not None:
                raise moved
            partial.publish(umask)
        return Staged(entry.path, copied, checksum, entry.path, checksum, recorded_identity(info))
    finally:
        os.close(fd)


def _copy_in_kernel(
    fd: int, partial: _Partial, size: int, hasher: Any, check: Callable[[], None], source: str
) -> int:
    """Copy `fd` into the partial copy slice by slice in the kernel (`copy_file_range`, else
    `sendfile`), hashing each slice's pages; the bytes copied (past `size`: the source grew)."""
    copied = 0
    kernel_copy = True
    while True:
        if copied:
            check()
        try:
            if kernel_copy:  # the source at an offset, the copy at its file position
                n = os.copy_file_range(fd, partial.fd, KERNEL_SLICE_BYTES, copied)
            else:
                n = os.sendfile(partial.fd, fd, copied, KERNEL_SLICE_BYTES)
        except OSError as e:
            if kernel_copy and e.errno in _NO_KERNEL_COPY:
                kernel_copy = False
                continue
            if e.errno == errno.ENOSPC:
                raise write_error(e, partial.target) from e
            raise source_error(e, source) from e
        if not n:
            return copied
        _hash_pages(partial.fd, copied, n, hasher)
        copied += n
        if copied > size:
            return copied  # the source grew: refused by the caller, without copying the rest


def _open_source(source: str) -> int:
    try:
        return open_regular(source, _READ)
    except OSError as e:
        raise source_error(e, source) from e


class _Partial:
    """A copy under its temporary name, made by this call (O_EXCL) and so removed if the copy
    fails; it gets its name only when verified (`publish`)."""

    def __init__(self, dest_root: str, entry: FileEntry, token: str, mode: int, flags: int = _WRITE) -> None:
        self.target = landing(
            dest_root, entry.path, f"staging into {dest_root}:", _LINK_FIX, checked_dirs(dest_root)
        )
        self.mode = mode
        self.path = os.path.join(dest_root, partial_name(entry.path, token))
        self.fd = _create(self.path, self.target, mode, flags)

    def publish(self, umask: int | None) -> None:
        """Give the verified copy the source's mode and its name (its descriptor closed)."""
        fd, self.fd = self.fd, -1
        _publish(fd, self.path, self.target, self.mode, umask)

    def __enter__(self) -> _Partial:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            return
        if self.fd >= 0:
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _verified(entry: FileEntry, algorithm: str, hasher: Any, size: int) -> str:
    """The copy's checksum, once its size and checksum are the manifest's (else the error)."""
    if size != entry.size:
        raise changed(entry.path, size, entry.size)
    checksum = hasher.hexdigest()
    if entry.checksum and checksum != entry.checksum:
        raise mismatch(entry, algorithm)
    return checksum


def _publish(out: int, tmp: str, target: str, mode: int, umask: int | None) -> None:
    """Give the verified copy the source's mode and its name; `out` is closed whatever happens."""
    try:
        try:
            if umask is None or mode & umask:
                os.fchmod(out, mode)  # the umask took bits the source has
        finally:
            os.close(out)
        os.rename(tmp, target)
    except OSError as e:
        raise write_error(e, target) from e


def _hash_pages(fd: int, offset: int, length: int, hasher: Any) -> None:
    """Hash `length` bytes of `fd` from `offset` through a read-only mapping of its pages."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    pages = mmap.mmap(fd, offset + length - start, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ, offset=start)
    with pages, memoryview(pages) as view, view[offset - start :] as mine:
        hasher.update(mine)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Map the pages at once (they are in the page cache, just written), not a fault each."""


def _create(tmp: str, target: str, mode: int, flags: int = _WRITE) -> int:
    try:
        try:
            return os.open(tmp, flags, mode)
        except FileNotFoundError:  # its folder is not there yet (`make_folders` makes them up front)
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            return os.open(tmp, flags, mode)
    except OSError as e:
        raise write_error(e, target) from e


def _write_all(fd: int, data: memoryview, target: str) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        raise write_error(e, target) from e


def make_folders(dest_root: str, paths: list[str]) -> None:
    """Make the folders of `paths` under `dest_root` up front, each judged once (`landing`),
    so that no copy looks for its folder or makes it."""
    folders = sorted({p.rpartition("/")[0] for p in paths} - {""})
    known = checked_dirs(dest_root)
    for folder in folders:
        if folder in known:
            continue
        landing(dest_root, f"{folder}/x", f"staging into {dest_root}:", _LINK_FIX, known)
        try:
            os.makedirs(os.path.join(dest_root, folder), exist_ok=True)
        except OSError as e:
            raise write_error(e, os.path.join(dest_root, folder)) from e
        known.add(folder)
