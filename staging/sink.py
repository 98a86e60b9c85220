"""Writing one staged file: under a temporary name, hashed as it is written, renamed when verified.

Bytes go through a page-aligned buffer so that node-local writes can bypass the page cache
(O_DIRECT, where the file system supports it); compressed files are decompressed on the way.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import landing
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, new_hasher

ALIGN = 4096
BUFFER_BYTES = 16 << 20
WRITE_SLICE_BYTES = 256 << 10
"""Buffered writes go in slices that fit a core's L2 cache with room (see `_hash_and_write`)."""
PARTIAL_SUFFIX = ".mlhpc-partial"
_LINK_FIX = "remove the link from DEST, or stage into a new folder"
_checked_dirs: dict[str, set[str]] = {}
"""Folders under each DEST that `landing` found real, by DEST: each is checked once a process,
not once a file (an lstat per level, 3.6 us a file one level down here). Staging holds DEST's
lock and never makes a link in it, so a folder found real stays real unless someone else writes
into DEST meanwhile; each staging starts afresh (`forget_checked_dirs`), as DEST may have changed."""


def forget_checked_dirs() -> None:
    _checked_dirs.clear()


def checked_dirs(dest_root: str, *, fresh: bool = False) -> set[str]:
    """The folders under `dest_root` found real so far (`fresh`: forget them first), for
    `safepath.landing`'s `known`: every writer into one DEST shares them."""
    if fresh:
        _checked_dirs.pop(dest_root, None)
    return _checked_dirs.setdefault(dest_root, set())


COMPRESSED_SUFFIXES = (".gz", ".zst")


@dataclass(frozen=True)
class SinkOptions:
    """How staged files are written (picklable: worker processes get a copy)."""

    algorithm: str = "xxh3_128"
    direct_io: bool = False
    """Write with O_DIRECT (where `direct_writes_pay`)."""
    decompress: bool = False
    """Decompress `.gz`/`.zst` files; the staged file drops the suffix."""
    umask: int | None = None
    """The umask staging runs under (None: unknown). A staged file keeps its source's mode; only
    when the umask strips some of its bits does that take a `fchmod` more."""
    run_token: str = ""
    """This staging's token, recorded in DEST before any temporary file is made and carried in
    every temporary file's name: a later run removes a temporary file only when its name carries
    a token DEST's bookkeeping records (`partial_name`), never a user's file of a similar name."""


@dataclass(frozen=True)
class Staged:
    """One file staged and verified: its entry at the destination and what it was made from."""

    path: str
    size: int
    checksum: str
    source: str
    source_checksum: str
    origin: str = ""
    """The source file's identity when it was copied (`origin.identity`; for an archive member,
    the archive's); "" when not known (a rerun then keeps the copy only on a manifest's checksum)."""

    @property
    def entry(self) -> FileEntry:
        return FileEntry(self.path, self.size, self.checksum)


def staged_path(source_path: str, options: SinkOptions) -> str:
    if options.decompress and source_path.endswith(COMPRESSED_SUFFIXES):
        return source_path.rsplit(".", 1)[0]
    return source_path


def partial_name(target: str, token: str = "") -> str:
    """The temporary name `target` is written under: `.name.<token>.mlhpc-partial` beside it."""
    head, _, name = target.rpartition("/")
    name = f".{name}.{token}{PARTIAL_SUFFIX}" if token else f".{name}{PARTIAL_SUFFIX}"
    return f"{head}/{name}" if head else name


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class BufferPool:
    """Reusable page-aligned buffers: fresh pages cost a page fault each, reused ones do not.

    Private anonymous memory, not `mmap`'s default shared mapping, whose pages are shmem's: the
    first O_DIRECT read into a fresh shmem page faults it in through shmem (a page-cache entry,
    accounting, LRU), a private page more cheaply. A new process staging 1 GiB into /dev/shm
    used 24 % less CPU here; once the buffers are warm the two are alike."""

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._lock = threading.Lock()

    def get(self, size: int) -> mmap.mmap:
        size = max(ALIGN, align_up(size))
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def put(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.setdefault(len(buffer), []).append(buffer)


FILE_MODE_BITS = 0o777
"""The bits a staged file takes from its source: no setuid, setgid or sticky bit (as tarfile's
`data_filter` does), which a copy on a shared node-local disk must not carry."""
DEFAULT_FILE_MODE = 0o644
"""A staged file's mode when its source's is not known (before the umask)."""


class FileSink:
    """One destination file for one source entry; `write` input bytes, then `finish` or `abort`.

    `mode`: the source's permission bits, which the copy keeps (less setuid, setgid, sticky)."""

    def __init__(
        self,
        dest_root: str,
        source: FileEntry,
        options: SinkOptions,
        buffer: mmap.mmap,
        mode: int | None = None,
        origin: str = "",
    ) -> None:
        self.source = source
        self.origin = origin
        self.mode = None if mode is None else mode & FILE_MODE_BITS
        self._umask = options.umask
        self.path = staged_path(source.path, options)
        # A folder on the way that is a symlink (planted, or an earlier copy's) could lead out of DEST.
        known = checked_dirs(dest_root)
        self.target = landing(dest_root, self.path, f"staging into {dest_root}:", _LINK_FIX, known)
        self.tmp = os.path.join(dest_root, partial_name(self.path, options.run_token))
        self._direct = options.direct_io
        self._algorithm = options.algorithm
        self.buffer = buffer
        self._view = memoryview(buffer)
        self._fill = 0
        self._flushed = 0
        self.received = 0
        self._in_hash = new_hasher(options.algorithm)
        self._decoder = _Decoder(source.path) if self.path != source.path else None
        self._out_hash = new_hasher(options.algorithm) if self._decoder else self._in_hash
        self._fd = -1
        self._fd = self._open()

    def _open(self) -> int:
        # A new file, never one that is there (planted, or a user's), and never through a link.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        mode = DEFAULT_FILE_MODE if self.mode is None else self.mode
        try:
            try:
                return os.open(self.tmp, flags | (os.O_DIRECT if self._direct else 0), mode)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(self.tmp), exist_ok=True)
                return os.open(self.tmp, flags | (os.O_DIRECT if self._direct else 0), mode)
        except OSError as e:
            raise write_error(e, self.target) from e

    def write(self, data: memoryview | bytes) -> None:
        self.received += len(data)
        if self._decoder is not None:
            self._in_hash.update(data)
            data = self._decoder.feed(data)
        self._put(data)

    def _put(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while view:
            n = min(len(view), len(self.buffer) - self._fill)
            self._view[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == len(self.buffer):
                self._flush()

    @property
    def room(self) -> int:
        """Bytes the buffer can take before it is written out."""
        return len(self.buffer) - self._fill

    def read_from(self, fd: int) -> int:
        """Read the next bytes of the source straight into the buffer (no decompression)."""
        assert self._decoder is None
        n = os.readv(fd, [self._view[self._fill :]])
        self.received += n
        self._fill += n
        if self._fill == len(self.buffer):
            self._flush()
        return n

    def write_block(self, buffer: mmap.mmap, n: int) -> None:
        """Hash and write the first `n` bytes of `buffer`, read there by someone else, straight
        from it (page-aligned and as large as a block, so O_DIRECT can write it whole)."""
        assert self._decoder is None and self._fill == 0
        view = memoryview(buffer)
        try:
            self.received += n
            self._hash_and_write(view, n)
        finally:
            view.release()

    def _flush(self) -> None:
        if self._fill:
            self._hash_and_write(self._view, self._fill)
            self._fill = 0

    def _hash_and_write(self, view: memoryview, n: int) -> None:
        """Append `view[:n]` to the file and to the output checksum: every byte of the copy
        passes here once. Buffered writes copy the bytes in the kernel, so they go a slice at a
        time, each hashed and copied while it is in the CPU's cache, not fetched from memory
        twice (~10 % less CPU into tmpfs); an O_DIRECT write, which the disk reads itself, whole."""
        step = max(n, 1) if self._direct else WRITE_SLICE_BYTES  # n is 0 when the source shrank
        for at in range(0, n, step):
            piece = view[at : min(n, at + step)]
            self._out_hash.update(piece)
            length = align_up(len(piece)) if self._direct else len(piece)
            self._write_fully(view[at : at + length], self._flushed)
            self._flushed += len(piece)

    def _write_fully(self, data: memoryview, offset: int) -> None:
        """pwrite all of `data`: a write cut short (a disk that fills takes what fits) goes on,
        so that the error the disk gives next (ENOSPC: disk full) is the one reported."""
        done = 0
        try:
            while done < len(data):
                written = os.pwrite(self._fd, data[done:], offset + done)
                if written <= 0:
                    raise OSError(errno.ENOSPC, "no space left on device")
                done += written
        except OSError as e:
            raise write_error(e, self.target) from e

    def finish(self) -> Staged:
        """Flush, check size and checksum against the source entry, rename into place."""
        try:
            if self._decoder is not None:
                self._put(self._decoder.finish(self.source.path))
            self._flush()
            if self._direct and self._flushed % ALIGN:
                os.ftruncate(self._fd, self._flushed)
            if self.mode is not None and (self._umask is None or self.mode & self._umask):
                os.fchmod(self._fd, self.mode)  # the umask took bits the source has
            fd, self._fd = self._fd, -1
            os.close(fd)
        except OSError as e:
            self.abort()
            raise write_error(e, self.target) from e
        checksum = self._in_hash.hexdigest()
        if self.received != self.source.size:
            self.abort()
            raise StagingError(
                f"staging source file {self.source.path} gave {self.received} bytes, its listing says "
                f"{self.source.size}; the source changed: regenerate its {MANIFEST_NAME} or stage again"
            )
        if self.source.checksum and checksum != self.source.checksum:
            self.abort()
            raise StagingError(
                f"staged copy of {self.source.path} fails its {self._algorithm} check: the source changed "
                f"since its {MANIFEST_NAME} was written (or was corrupted in transit); stage again"
            )
        try:
            os.replace(self.tmp, self.target)
        except OSError as e:  # not the source's fault: say so (another writer took the partial?)
            self.abort()
            raise write_error(e, self.target) from e
        out = self._out_hash.hexdigest() if self._decoder else checksum
        return Staged(self.path, self._flushed, out, self.source.path, checksum, self.origin)

    def abort(self) -> None:
        """Remove the temporary file this sink made (O_EXCL: it is this process's own)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


class _Decoder:
    """Streaming gzip (several members allowed) or zstd decompression."""

    def __init__(self, path: str) -> None:
        self.kind = "gz" if path.endswith(".gz") else "zst"
        self._new()

    def _new(self) -> None:
        if self.kind == "gz":
            self._obj: Any = zlib.decompressobj(wbits=31)
        else:
            import zstandard

            self._obj = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)

    def feed(self, data: memoryview | bytes) -> bytes:
        out = [self._obj.decompress(data)]
        if self.kind == "gz":
            while self._obj.eof and self._obj.unused_data:
                rest = self._obj.unused_data
                self._new()
                out.append(self._obj.decompress(rest))
        return b"".join(out)

    def finish(self, path: str) -> bytes:
        if self.kind == "gz":
            tail = self._obj.flush()
            if not self._obj.eof:
                raise StagingError(f"{path} is a truncated gzip file; restore it from the original")
            return tail
        return self._obj.flush()


def write_error(e: OSError, target: str) -> StagingError:
    if e.errno == errno.ENOSPC:
        root = os.path.dirname(target)
        try:
            free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
        except OSError:
            free = -1
        return StagingError(
            f"disk full while writing {target} ({free} bytes free); free space on that disk or set "
            "MLHPC_LOCAL_DIR to a larger one, then rerun to resume"
        )
    return StagingError(f"cannot write {target}: {e.strerror}; check the node-local directory")
