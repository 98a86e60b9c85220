"""Buffered copies through the page cache: each slice of a file is read, hashed and written once.

The path of a job whose share fits in memory or whose source is cached (`iopath`). The bytes
pass through one small buffer per thread: read (from the source's page cache, or the disk),
hashed while they are in the CPU's cache, written (into the destination's page cache, where the
trainer's first epoch finds them). The checksum is of the very bytes written, and it is checked
against the manifest before the copy gets its name: a file smaller than a slice is verified
before anything is written at all. Kernel-side copies (`copy_file_range`) would keep the bytes
out of Python, but then they must be read again to be hashed: one more pass over memory than
this, for a result that no longer comes from the bytes read.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable

from mlhpc.common.errors import StagingError
from mlhpc.common.safepath import landing
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, new_hasher
from mlhpc.staging.sink import FILE_MODE_BITS, Staged, checked_dirs, partial_name, write_error

SLICE_BYTES = 1 << 20
"""One read, hash and write: fits a core's L2 cache with room, so the hash and the write's copy
read the bytes from cache; a file up to this size is one read and one write."""
_READ = os.O_RDONLY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW  # no planted link
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
) -> Staged:
    """Copy one file through the page cache, verified against `entry` before it is renamed.

    The source is read in slices until a short read reaches the listed size (a file that grew
    reads on and is caught, as is one that shrank); its mode is kept (less setuid, setgid,
    sticky). `check` runs before each slice after the first, and raises to stop the copy."""
    source = os.path.join(src_root, entry.path)
    view = _buffer()
    try:
        fd = os.open(source, _READ)
    except OSError as e:
        raise source_error(e, source) from e
    out = -1
    target = tmp = ""
    try:
        try:
            mode = os.fstat(fd).st_mode & FILE_MODE_BITS
            n = os.readv(fd, [view[: min(entry.size + 1, SLICE_BYTES)]])
        except OSError as e:
            raise source_error(e, source) from e
        hasher = new_hasher(algorithm)
        hasher.update(view[:n])
        if n <= entry.size < SLICE_BYTES:  # the whole file is in: verify before writing anything
            if n != entry.size:
                raise changed(entry.path, n, entry.size)
            if entry.checksum and hasher.hexdigest() != entry.checksum:
                raise mismatch(entry, algorithm)
        target = landing(
            dest_root, entry.path, f"staging into {dest_root}:", _LINK_FIX, checked_dirs(dest_root)
        )
        tmp = os.path.join(dest_root, partial_name(entry.path))
        out = _create(tmp, target, mode)
        received = n
        while n:
            _write_all(out, view[:n], target)
            if received >= entry.size and n < SLICE_BYTES:
                break  # a short read that reaches the listed size: the end (a grown file reads on)
            check()
            try:
                n = os.readv(fd, [view[:SLICE_BYTES]])
            except OSError as e:
                raise source_error(e, source) from e
            hasher.update(view[:n])
            received += n
        if received != entry.size:
            raise changed(entry.path, received, entry.size)
        checksum = hasher.hexdigest()
        if entry.checksum and checksum != entry.checksum:
            raise mismatch(entry, algorithm)
        try:
            if umask is None or mode & umask:
                os.fchmod(out, mode)  # the umask took bits the source has
            os.close(out)
            out = -1
            os.rename(tmp, target)
        except OSError as e:
            raise write_error(e, target) from e
        return Staged(entry.path, received, checksum, entry.path, checksum)
    except BaseException:
        if out >= 0:
            os.close(out)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def _create(tmp: str, target: str, mode: int) -> int:
    try:
        try:
            return os.open(tmp, _WRITE, mode)
        except FileNotFoundError:  # its folder is not there yet (`make_folders` makes them up front)
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            return os.open(tmp, _WRITE, mode)
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
