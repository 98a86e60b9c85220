"""The staging engine: one file, read → hash → partial file → verify → rename.

Every staged file passes here once, whatever brought its bytes: a copy from the source
(`copy_file`), a member of an archive, a piece of another node's stream (`Partial`). The bytes
are hashed as they are written, the copy is checked against its entry (size, and checksum where
the source has one) and only then gets its name; `decompress` decodes `x.gz`/`x.zst` on the
way. The caller journals what it returns.

One I/O path, through the page cache. Measured (perf/RESULTS.md, 2026-11-28): in a memory cgroup
smaller than the dataset, cold source, O_DIRECT reads and writes took 1.1-2x as long as this
path, and dropping each copy's pages (`posix_fadvise(DONTNEED)`) 3-7 % longer than leaving them
to the kernel's reclaim; the kernel copy (`copy_file_range` + a mapped hash) cost what
read-hash-write costs. So neither is kept.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import landing
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry
from mlhpc.staging.request import CopyOptions
from mlhpc.staging.source import (
    changed_while_copied,
    new_hasher,
    open_source,
    recorded_identity,
    source_error,
)

SLICE_BYTES = 1 << 20
"""One read, hash and write: fits a core's L2 cache with room, so the hash and the write's copy
read the bytes from cache; a file up to this size is one read and one write."""
WRITE_SLICE_BYTES = 256 << 10
"""Bytes handed to the engine in larger pieces (an exchange round, an archive member) are hashed
and written in slices of this size, each while it is in the CPU's cache (~10 % less CPU)."""
PARTIAL_SUFFIX = ".mlhpc-partial"
COMPRESSED_SUFFIXES = (".gz", ".zst")
FILE_MODE_BITS = 0o777
"""The bits a staged file takes from its source: no setuid, setgid or sticky bit (as tarfile's
`data_filter` does), which a copy on a shared node-local disk must not carry."""
DEFAULT_FILE_MODE = 0o644
"""A staged file's mode when its source's is not known (before the umask)."""
LINK_FIX = "remove the link from DEST, or stage into a new folder"
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW  # new: nobody's file, no link
_local = threading.local()
_stopping: set[str] = set()
"""Destinations whose copies stop at their next slice: an error or an interruption (Ctrl-C,
SIGTERM) elsewhere, so that a large file's copy does not hold the exit for seconds."""
_checked_dirs: dict[str, set[str]] = {}
"""Folders under each DEST that `landing` found real, by DEST: each is checked once a process,
not once a file (an lstat per level, 3.6 us a file one level down here). Staging holds DEST's
lock and never makes a link in it, so a folder found real stays real unless someone else writes
into DEST meanwhile; each staging starts afresh (`forget_checked_dirs`), as DEST may have changed."""


@dataclass(frozen=True)
class Staged:
    """One file staged and verified: its entry at the destination and what it was made from."""

    path: str
    size: int
    checksum: str
    source: str
    source_checksum: str
    origin: str = ""
    """The source file's identity when it was copied (`source.identity`; for an archive member,
    the archive's); "" when not known (a rerun then keeps the copy only on a manifest's checksum)."""

    @property
    def entry(self) -> FileEntry:
        return FileEntry(self.path, self.size, self.checksum)


@dataclass
class Work:
    """What one rank did."""

    staged: list[Staged] = field(default_factory=list)
    """Files this rank wrote."""
    skipped: int = 0
    """Files this rank found staged and verified already."""
    read_bytes: int = 0
    """Bytes this rank read from the source."""
    held: list[Staged] | None = None
    """Everything the node holds, when this rank alone knows it (an archive's extractor)."""
    records: dict[str, Staged] | None = None
    """Every file of the node by source path, when this rank alone staged them (one rank a
    node, copying): the node's manifest is made from these, not read back from the journals."""


def forget_checked_dirs() -> None:
    _checked_dirs.clear()


def checked_dirs(dest_root: str, *, fresh: bool = False) -> set[str]:
    """The folders under `dest_root` found real so far (`fresh`: forget them first), for
    `safepath.landing`'s `known`: every writer into one DEST shares them."""
    if fresh:
        _checked_dirs.pop(dest_root, None)
    return _checked_dirs.setdefault(dest_root, set())


def staged_path(source_path: str, options: CopyOptions) -> str:
    if options.decompress and source_path.endswith(COMPRESSED_SUFFIXES):
        return source_path.rsplit(".", 1)[0]
    return source_path


def partial_name(target: str, token: str = "") -> str:
    """The temporary name `target` is written under: `.name.<token>.mlhpc-partial` beside it."""
    head, _, name = target.rpartition("/")
    name = f".{name}.{token}{PARTIAL_SUFFIX}" if token else f".{name}{PARTIAL_SUFFIX}"
    return f"{head}/{name}" if head else name


class Partial:
    """One staged file under its temporary name: `write` its bytes (hashed as they go), then
    `finish` (checked against `entry`, renamed) or `abort` (removed).

    The temporary file is made by this object (O_EXCL, never through a link), so removing it
    removes nothing of anyone else's. `mode`: the source's permission bits, which the copy keeps
    (less setuid, setgid, sticky)."""

    def __init__(
        self,
        dest_root: str,
        entry: FileEntry,
        options: CopyOptions,
        mode: int | None = None,
        origin: str = "",
        in_hash: Any = None,
    ) -> None:
        self.entry = entry
        self.origin = origin
        self.options = options
        self.mode = DEFAULT_FILE_MODE if mode is None else mode & FILE_MODE_BITS
        self.path = staged_path(entry.path, options)
        # A folder on the way that is a symlink (planted, or an earlier copy's) could lead out of DEST.
        self.target = landing(
            dest_root, self.path, f"staging into {dest_root}:", LINK_FIX, checked_dirs(dest_root)
        )
        self.tmp = os.path.join(dest_root, partial_name(self.path, options.run_token))
        self.received = 0
        self.written = 0
        self.in_hash = in_hash or new_hasher(options.algorithm)
        """The checksum of the source bytes (`in_hash`: one the caller feeds as it reads)."""
        self._decoder = _Decoder(entry.path) if self.path != entry.path else None
        self._out_hash = new_hasher(options.algorithm) if self._decoder else self.in_hash
        self.fd = -1
        self.fd = _create(self.tmp, self.target, self.mode)

    def write(self, data: memoryview | bytes, *, hashed: bool = False) -> None:
        """Append source bytes (`hashed`: the caller fed them to `in_hash` already)."""
        self.received += len(data)
        if self._decoder is None:
            self._append(memoryview(data), hash_out=not hashed)  # in and out are one checksum
            return
        if not hashed:
            self.in_hash.update(data)
        self._append(memoryview(self._decoder.feed(data)), hash_out=True)

    def _append(self, view: memoryview, hash_out: bool) -> None:
        for at in range(0, len(view), WRITE_SLICE_BYTES):
            piece = view[at : at + WRITE_SLICE_BYTES]
            if hash_out:
                self._out_hash.update(piece)
            _write_all(self.fd, piece, self.target)
        self.written += len(view)

    def finish(self) -> Staged:
        """Check size and checksum against the entry, give the copy its mode and its name; on
        any failure the temporary file is removed."""
        try:
            return self._finish()
        except BaseException:
            self.abort()
            raise

    def _finish(self) -> Staged:
        if self._decoder is not None:
            self._append(memoryview(self._decoder.finish(self.entry.path)), hash_out=True)
        checksum = verified(self.entry, self.options.algorithm, self.in_hash, self.received)
        fd, self.fd = self.fd, -1
        try:
            try:
                umask = self.options.umask
                if umask is None or self.mode & umask:
                    os.fchmod(fd, self.mode)  # the umask took bits the source has
            finally:
                os.close(fd)
            os.rename(self.tmp, self.target)
        except OSError as e:  # not the source's fault: say so (another writer took the partial?)
            raise write_error(e, self.target) from e
        out = self._out_hash.hexdigest() if self._decoder else checksum
        return Staged(self.path, self.written, out, self.entry.path, checksum, self.origin)

    def abort(self) -> None:
        """Remove the temporary file (made by this object: O_EXCL)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)

    def __enter__(self) -> Partial:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None or self.fd >= 0:
            self.abort()


def copy_file(
    src_root: str,
    dest_root: str,
    entry: FileEntry,
    options: CopyOptions,
    check: Callable[[], None] | None = None,
) -> Staged:
    """Copy one source file, verified against `entry` before it is renamed; not journaled.

    The source is read in slices until a short read reaches the listed size (a file that grew
    reads on and is caught, as is one that shrank); a file smaller than a slice is read whole
    into a buffer one byte larger (the read itself shows its end) and checked before anything
    is written. `check` runs before each slice after the first and raises to stop the copy (by
    default: `request_stop` for this DEST)."""
    check = check or (lambda: stop_if_asked(dest_root))
    source = os.path.join(src_root, entry.path)
    view = _buffer()
    try:
        fd = open_source(source)
    except OSError as e:
        raise source_error(e, source) from e
    try:
        try:
            info = os.fstat(fd)
            n = os.readv(fd, [view[: min(entry.size + 1, SLICE_BYTES)]])
        except OSError as e:
            raise source_error(e, source) from e
        in_hash = new_hasher(options.algorithm)
        in_hash.update(view[:n])
        if n <= entry.size < SLICE_BYTES:  # the whole file is in: verify before writing anything
            verified(entry, options.algorithm, in_hash, n)
        origin = recorded_identity(info)
        with Partial(dest_root, entry, options, info.st_mode, origin, in_hash) as partial:
            while n:
                partial.write(view[:n], hashed=True)
                if partial.received >= entry.size and n < SLICE_BYTES:
                    break  # a short read that reaches the listed size: the end (a grown file reads on)
                check()
                try:
                    n = os.readv(fd, [view[:SLICE_BYTES]])
                except OSError as e:
                    raise source_error(e, source) from e
                in_hash.update(view[:n])
            if (moved := changed_while_copied(source, info, fd)) is not None:
                raise moved
            return partial.finish()
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one file, once per node
# While training reads the dataset (--staging overlap), a rank that needs a file not yet staged
# copies it itself; the staging copies and these take the file's claim first, so that a node
# reads each file from the source once. A claim is an flock on a file of its own in the claims
# folder (beside DEST, never in it): the kernel drops it when its holder dies, and the holder
# that copied writes the copy's record into it for the next one to find.
def claim_path(claims_dir: str, rel: str) -> str:
    """The claim file of `rel`: a hash of the name, so no name from a manifest makes a path."""
    return os.path.join(claims_dir, hashlib.blake2b(rel.encode(), digest_size=16).hexdigest())


@contextlib.contextmanager
def claimed(claims_dir: str, rel: str) -> Iterator[int]:
    """Hold this node's claim on `rel` (waiting for its holder); yields the claim file's descriptor."""
    path = claim_path(claims_dir, rel)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise write_error(e, path) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def claim_record(fd: int) -> tuple[Staged, str] | None:
    """The copy recorded in a held claim, and who made it; None when nobody finished one."""
    try:
        raw = os.pread(fd, 1 << 16, 0)
        fields, by = json.loads(raw)
        return Staged(*fields), str(by)
    except (OSError, ValueError, TypeError):
        return None  # empty (nobody finished), or torn by a holder that died while writing


def record_claim(fd: int, staged: Staged, by: str) -> None:
    """Write the copy's record into the held claim (`by`: "staging" or "demand")."""
    fields = [staged.path, staged.size, staged.checksum, staged.source, staged.source_checksum, staged.origin]
    data = json.dumps([fields, by]).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def copy_once(
    src_root: str,
    dest_root: str,
    entry: FileEntry,
    options: CopyOptions,
    by: str,
    check: Callable[[], None] | None = None,
) -> tuple[Staged, bool]:
    """`copy_file` under the file's claim (`options.claims`): (the copy, whether this call made
    it). A copy another holder recorded and whose file is in place is returned as it is."""
    with claimed(options.claims, entry.path) as fd:
        found = claim_record(fd)
        if found is not None and os.path.isfile(os.path.join(dest_root, found[0].path)):
            return found[0], False
        staged = copy_file(src_root, dest_root, entry, options, check)
        record_claim(fd, staged, by)
        return staged, True


def demand_copies(claims_dir: str) -> int:
    """The files of a node copied on demand (read by training before staging reached them)."""
    count = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(claims_dir) as listing:
        for item in listing:
            with (
                contextlib.suppress(OSError, ValueError, TypeError, IndexError),
                open(item.path, "rb") as handle,
            ):
                count += json.loads(handle.read(1 << 16))[1] == "demand"
    return count


def _buffer() -> memoryview:
    """This thread's slice buffer (one more page: a whole-file read shows the file's end)."""
    view = getattr(_local, "view", None)
    if view is None:
        buffer = mmap.mmap(-1, SLICE_BYTES + mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = _local.view = memoryview(buffer)
    return view


def verified(entry: FileEntry, algorithm: str, hasher: Any, size: int) -> str:
    """The checksum of `size` hashed bytes, once size and checksum are the entry's (else the error)."""
    if size != entry.size:
        raise StagingError(
            f"staging source file {entry.path} gave {size} bytes, its listing says {entry.size}; the "
            f"source changed: regenerate its {MANIFEST_NAME} or stage again"
        )
    checksum = hasher.hexdigest()
    if entry.checksum and checksum != entry.checksum:
        raise StagingError(
            f"staged copy of {entry.path} fails its {algorithm} check: the source changed since its "
            f"{MANIFEST_NAME} was written (or was corrupted in transit); stage again"
        )
    return checksum


def request_stop(dest_root: str) -> None:
    """Have the copies into `dest_root` under way stop at their next slice (their partials removed)."""
    _stopping.add(dest_root)


def withdraw_stop(dest_root: str) -> None:
    """Let the next copies into `dest_root` run (after the ones told to stop have ended)."""
    _stopping.discard(dest_root)


def stop_if_asked(dest_root: str) -> None:
    if dest_root in _stopping:
        raise StagingError(f"copying into {dest_root} was stopped; rerun to resume")


def make_folders(dest_root: str, paths: list[str]) -> None:
    """Make the folders of `paths` under `dest_root` up front, each judged once (`landing`),
    so that no copy looks for its folder or makes it."""
    known = checked_dirs(dest_root)
    for folder in sorted({p.rpartition("/")[0] for p in paths} - {""}):
        if folder in known:
            continue
        landing(dest_root, f"{folder}/x", f"staging into {dest_root}:", LINK_FIX, known)
        try:
            os.makedirs(os.path.join(dest_root, folder), exist_ok=True)
        except OSError as e:
            raise write_error(e, os.path.join(dest_root, folder)) from e
        known.add(folder)


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
    """Write all of `data`: a write cut short (a disk that fills takes what fits) goes on, so
    that the error the disk gives next (ENOSPC: disk full) is the one reported."""
    try:
        while data:
            written = os.write(fd, data)
            if written <= 0:
                raise OSError(errno.ENOSPC, "no space left on device")
            data = data[written:]
    except OSError as e:
        raise write_error(e, target) from e


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
