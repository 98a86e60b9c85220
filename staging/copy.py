"""Copying files from the source to node-local disk in parallel workers, one pass per file.

Each file is read once into a page-aligned buffer, hashed from it and written from it (no
second read of source or copy). Threads overlap I/O; worker processes (worker.py) add CPUs for
the Python work per file, which dominates with many small files.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safepath import relative_path
from mlhpc.staging.buffered import KERNEL_COPY_MIN_BYTES, copy_buffered, copy_kernel, source_error
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_file
from mlhpc.staging.plan import CopyOp
from mlhpc.staging.sink import (
    BUFFER_BYTES,
    BufferPool,
    FileSink,
    SinkOptions,
    Staged,
    staged_path,
    write_error,
)

log = logging.getLogger(__name__)
JOURNAL_PREFIX = ".mlhpc_journal."
DIRECT_READ_MIN_BYTES = 4 << 20
JOURNAL_BATCH = 64
JOURNAL_DELAY_S = 1.0
MAX_READ_AHEAD = 4
"""Block reads in flight per large file, at most. One at a time leaves a disk that wants a deep
queue idle when there are fewer files than workers (8 x 128 MiB files here: +32 %)."""
TAIL_PIECE_BYTES = 2 << 20
"""The last block's worth of a file read ahead goes in pieces this size: what is left to write
once its last read is in is one piece, not one block (see `read_spans`)."""
_pool = BufferPool()
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()
_stopping: set[str] = set()
"""Destinations whose copies stop at their next block: an error or an interruption (Ctrl-C,
SIGTERM) elsewhere, so that a large file's copy does not hold the exit for seconds."""
_journals: dict[str, Journal] = {}
_journals_lock = threading.Lock()


@dataclass(frozen=True)
class CopyJob:
    """What a worker needs to copy files (picklable for worker processes)."""

    src_root: str
    dest_root: str
    options: SinkOptions
    threads: int
    read_ahead: int = 1
    """Block reads in flight per large file (see `read_ahead_depth`)."""
    direct_reads: bool = True
    """Read large files with O_DIRECT where the source allows it (else through the page cache)."""
    kernel_copy: bool = False
    """On the buffered path, copy files of `KERNEL_COPY_MIN_BYTES` or more in the kernel."""

    @property
    def buffered(self) -> bool:
        """Whether files go the lean buffered path (`buffered.copy_buffered`)."""
        return not (self.direct_reads or self.options.direct_io or self.options.decompress)


def read_ahead_depth(workers: int, files: int) -> int:
    """Reads in flight per large file: the workers left idle by a short file list go to reading
    ahead, so reads in flight (and buffers held) stay at about `workers`."""
    return max(1, min(MAX_READ_AHEAD, workers // max(1, min(files, workers))))


BUFFER_SHARE = 0.5
"""The direct path's buffers take at most this share of the memory the node may use."""


def fit_in_memory(workers: int, sizes: Sequence[int], memory_bytes: int | None) -> tuple[int, int]:
    """(threads, reads in flight per large file) for the direct path, so that their buffers take
    at most `BUFFER_SHARE` of `memory_bytes` (None: unknown, not cut). A thread copying a large
    file holds its reads' blocks, the sink's and a spare, each `BUFFER_BYTES`; one copying small
    files, one buffer of the largest. Reads in flight give way first, then threads: in a 256 MiB
    memory cgroup, 32 threads' 16 MiB buffers (4 in flight a file) got the process killed."""
    depth = read_ahead_depth(workers, len(sizes))
    if memory_bytes is None or not sizes:
        return workers, depth
    budget = int(memory_bytes * BUFFER_SHARE)
    largest = max(sizes)
    if largest < BUFFER_BYTES:
        return max(1, min(workers, budget // (largest + 1 + mmap.PAGESIZE))), depth
    wanted = min(workers, len(sizes))
    while depth > 1 and budget // ((depth + 2) * BUFFER_BYTES) < wanted:
        depth -= 1
    return max(1, min(workers, budget // ((depth + 2) * BUFFER_BYTES))), depth


def copy_file(job: CopyJob, entry: FileEntry, record: bool = True) -> Staged:
    """Copy one file: read it into an aligned buffer, hash it there, write it under a temporary name.

    Large files are also read with O_DIRECT where the source allows it: no page-cache pages to
    allocate and fill, which is most of the CPU cost of a buffered copy. A file smaller than a
    block is read whole into a buffer one byte larger, so that the read itself shows whether the
    file still has its listed size: no read-ahead hint, no read to find the end. With many small
    files these system calls are most of the work, and each one costs a hand-over of the GIL
    among the worker threads; the one `fstat` left gives the mode the copy keeps.
    """
    source = os.path.join(job.src_root, entry.path)
    whole = entry.size < BUFFER_BYTES
    direct = job.direct_reads and entry.size >= DIRECT_READ_MIN_BYTES and not job.options.decompress
    fd, direct = _open_source(source, direct, sequential=not whole)
    buffer = _pool.get(entry.size + 1 if whole else BUFFER_BYTES)
    sink: FileSink | None = None
    try:
        info = os.fstat(fd)
        if not whole and info.st_size != entry.size:
            raise StagingError(
                f"staging source file {source} has {info.st_size} bytes, its listing says {entry.size}; "
                f"the source changed: regenerate its {MANIFEST_NAME} or stage again"
            )
        sink = FileSink(job.dest_root, entry, job.options, buffer, mode=info.st_mode)
        while sink.path != entry.path and (data := os.read(fd, BUFFER_BYTES)):
            sink.write(data)
        if direct and job.read_ahead > 1:
            try:
                _read_ahead(fd, sink, entry.size, job, buffer)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.close(fd)  # O_DIRECT refused this read: go on through the page cache
                fd, direct = _open_source(source, False)
            os.lseek(fd, sink.received, os.SEEK_SET)  # the loop below reads what is left, if anything
        while sink.path == entry.path:
            _check_stopping(job)
            try:
                room = sink.room
                n = sink.read_from(fd)
                if not n or (n < room and sink.received == entry.size):
                    break  # a short read that brings the listed size is the end of the file
            except OSError as e:
                if not (direct and e.errno == errno.EINVAL):
                    raise
                os.close(fd)  # O_DIRECT refused this read: go on through the page cache
                fd, direct = _open_source(source, False)
                os.lseek(fd, sink.received, os.SEEK_SET)
        staged = sink.finish()
        sink = None
        if record:
            journal(job.dest_root).record(staged)
        return staged
    except OSError as e:
        raise source_error(e, source) from e
    finally:
        if sink is not None:
            sink.abort()
        os.close(fd)
        _pool.put(buffer)


def copy_chunk(job: CopyJob, entries: Sequence[FileEntry]) -> list[Staged]:
    """Copy a run of files one after another (a thread's unit of work: one hand-over per chunk,
    not per file), journaled together."""
    done: list[Staged] = []
    try:
        for entry in entries:
            _check_stopping(job)
            done.append(copy_one(job, entry))
    finally:  # what was renamed into place is journaled, also when a later file fails
        journal(job.dest_root).record_many(done)
    return done


def copy_one(job: CopyJob, entry: FileEntry) -> Staged:
    """Copy one file by the job's path: buffered (lean), or through `copy_file`; not journaled."""
    if job.buffered:
        o = job.options
        copy = copy_kernel if job.kernel_copy and entry.size >= KERNEL_COPY_MIN_BYTES else copy_buffered
        return copy(job.src_root, job.dest_root, entry, o.algorithm, o.umask, lambda: _check_stopping(job))
    return copy_file(job, entry, record=False)


def chunks(entries: Sequence[FileEntry], pieces: int, most: int = 64) -> list[list[FileEntry]]:
    """Consecutive runs of `entries`, about `pieces` of them (so that every thread gets several
    and they finish together), up to `most` files and `CHUNK_BYTES` each."""
    per = max(1, min(most, len(entries) // max(1, pieces)))
    return consecutive_runs(entries, per, CHUNK_BYTES)


def consecutive_runs(entries: Sequence[FileEntry], most_files: int, most_bytes: int) -> list[list[FileEntry]]:
    """`entries` cut, in order, into runs of at most `most_files` files and `most_bytes` bytes (a
    larger file alone)."""
    out: list[list[FileEntry]] = []
    current: list[FileEntry] = []
    size = 0
    for entry in entries:
        if current and (len(current) >= most_files or size + entry.size > most_bytes):
            out.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.size
    if current:
        out.append(current)
    return out


CHUNK_BYTES = 64 << 20


def _read_ahead(fd: int, sink: FileSink, size: int, job: CopyJob, spare: mmap.mmap) -> None:
    """Copy `size` bytes with `depth` (`job.read_ahead`) block reads in flight, hashed and
    written in order.

    Block i+depth is asked for before block i is written, into one more buffer (`spare`: the
    sink's, idle here, and as large as any block this far into the file), so that `depth` reads
    stay in flight while a block is written."""
    global _readers
    depth = job.read_ahead
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(max_workers=64, thread_name_prefix="mlhpc-read")
    readers = _readers
    own = [_pool.get(BUFFER_BYTES) for _ in range(depth)]
    buffers = [*own, spare]
    views = [memoryview(buffer) for buffer in buffers]
    spans = read_spans(size)
    pending: deque[Future[int]] = deque()

    def read(i: int) -> int:
        offset, length = spans[i]
        return os.preadv(fd, [views[i % len(views)][:length]], offset)

    try:
        pending.extend(readers.submit(read, i) for i in range(min(depth, len(spans))))
        for i, (offset, length) in enumerate(spans):
            _check_stopping(job)
            n = pending.popleft().result()
            whole = n == min(length, size - offset)
            if whole and i + depth < len(spans):
                pending.append(readers.submit(read, i + depth))
            sink.write_block(buffers[i % len(buffers)], n)
            if not whole:
                return  # the file shrank: the size check in `finish` names it
    finally:
        for future in pending:  # a buffer still being read into must not go back to the pool
            future.exception()
        for view in views:
            view.release()
        for buffer in own:
            _pool.put(buffer)


def read_spans(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the reads that copy a `size`-byte file: blocks, then its last block's
    worth in `TAIL_PIECE_BYTES` pieces. Writes trail reads by about a block per file: copying
    8 x 128 MiB into /dev/shm here, 29-183 ms of writing was left after the last read with 16 MiB
    pieces, 13-94 ms with 4 MiB and 6-32 ms with 2 MiB (1.9-3.0, 2.1-3.0 and 2.7-3.1 GB/s). The
    last piece may reach past the end: its read comes back short. Offsets and lengths stay
    multiples of the page, as O_DIRECT wants."""
    tail = max(0, size - BUFFER_BYTES) // TAIL_PIECE_BYTES * TAIL_PIECE_BYTES
    spans = [(at, min(BUFFER_BYTES, tail - at)) for at in range(0, tail, BUFFER_BYTES)]
    return spans + [(at, TAIL_PIECE_BYTES) for at in range(tail, max(size, 1), TAIL_PIECE_BYTES)]


def _open_source(path: str, direct: bool, sequential: bool = True) -> tuple[int, bool]:
    """Open a source file, with O_DIRECT if asked and allowed; (fd, whether O_DIRECT). Buffered
    reads of a file read in more than one piece get the kernel's sequential read-ahead hint."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        if direct:
            try:
                return os.open(path, flags | os.O_DIRECT), True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        fd = os.open(path, flags)
    except OSError as e:
        raise source_error(e, path) from e
    if sequential and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd, False


class Journal:
    """Per-process log of verified files in the destination: what a rerun may skip, and what
    the node's manifest is made from.

    One line per file, recorded after the file was renamed into place and appended in batches
    (`JOURNAL_BATCH` lines or `JOURNAL_DELAY_S`, whichever comes first; `flush` and `close`
    write the rest): with an append per file, threads wait on the file's lock, which cost about
    40 of the ~250 us of CPU a 64 KiB file took with 8 threads here. A process killed mid-batch
    loses that batch's lines, so a rerun checks those files again against the source's
    checksums, or copies them again.
    """

    def __init__(self, dest_root: str) -> None:
        self.path = os.path.join(dest_root, f"{JOURNAL_PREFIX}{os.getpid()}.jsonl")
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as e:  # a destination's fault, not the source file's that was being copied
            raise write_error(e, self.path) from e
        self._lines: list[str] = []
        self._first_at = 0.0
        self._lock = threading.Lock()

    def record(self, staged: Staged) -> None:
        self.record_many([staged])

    def record_many(self, staged: Sequence[Staged]) -> None:
        lines = [json.dumps([s.path, s.size, s.checksum, s.source, s.source_checksum]) for s in staged]
        with self._lock:
            if not self._lines:
                self._first_at = time.monotonic()
            self._lines.extend(lines)
            if len(self._lines) < JOURNAL_BATCH and time.monotonic() - self._first_at < JOURNAL_DELAY_S:
                return
        self.flush()

    def flush(self) -> None:
        """Append the lines recorded so far (one write: a crash cuts at most its last line)."""
        with self._lock:
            lines, self._lines = self._lines, []
            if lines:
                try:
                    os.write(self._fd, "".join(f"{line}\n" for line in lines).encode())
                except OSError as e:
                    raise write_error(e, self.path) from e

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self._fd)


def journal(dest_root: str) -> Journal:
    with _journals_lock:
        if dest_root not in _journals:
            _journals[dest_root] = Journal(dest_root)
        return _journals[dest_root]


def close_journal(dest_root: str) -> None:
    with _journals_lock:
        found = _journals.pop(dest_root, None)
    if found is not None:
        found.close()


def read_journals(dest: Path) -> dict[str, Staged]:
    """Everything earlier runs verified into `dest`, by source path: its journals and manifest."""
    found: dict[str, Staged] = {}
    manifest_path = dest / MANIFEST_NAME
    if manifest_path.is_file():
        try:
            for f in Manifest.read(manifest_path).files:
                found[f.path] = Staged(f.path, f.size, f.checksum, f.path, "")
        except StagingError:
            pass  # a broken manifest in the destination only means nothing is skipped
    journals = sorted(dest.glob(f"{JOURNAL_PREFIX}*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    for path in journals:  # oldest first, so the latest record of a file wins
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        try:
            records = json.loads(f"[{','.join(lines)}]")
        except ValueError:  # a line cut short when its process was killed: keep the good ones
            records = [r for r in map(_parse_line, lines) if r is not None]
        where = f"{path}: record"
        for fields in records:
            if (record := _record(fields, where)) is not None:
                found[record.source] = record
    return found


def _parse_line(line: str) -> list[Any] | None:
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    return fields if isinstance(fields, list) and len(fields) == 5 else None


_TYPES = (str, int, str, str, str)


def _record(fields: Any, where: str) -> Staged | None:
    """A journal line as a record, or None (ignored: a rerun copies that file again) if it is
    not one or names a path that leaves DEST (`relative_path` judges both of its paths)."""
    if not isinstance(fields, list) or len(fields) != 5:
        return None
    if not all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(fields, _TYPES, strict=True)):
        return None
    try:
        path, source = (relative_path(fields[i], where, "it is ignored") for i in (0, 3))
    except StagingError as e:
        log.warning("%s", e)
        return None
    return Staged(path, fields[1], fields[2], source, fields[4])


def already_staged(
    dest: Path, entry: FileEntry, evidence: dict[str, Staged], options: SinkOptions
) -> Staged | None:
    """`entry`'s copy in `dest` if it is there already and still verifies (a rerun skips it)."""
    record = evidence.get(entry.path)
    path = staged_path(entry.path, options)
    if record is not None and (
        record.path != path or (entry.checksum and record.source_checksum not in ("", entry.checksum))
    ):
        record = None
    if record is None and entry.checksum and path == entry.path:
        record = Staged(path, entry.size, entry.checksum, entry.path, entry.checksum)
    if record is None:
        return None
    target = dest / path
    try:
        if target.stat().st_size == record.size and hash_file(target, options.algorithm) == record.checksum:
            return record
    except (OSError, StagingError):
        pass
    return None


def run_copies(
    ops: Sequence[CopyOp],
    job: CopyJob,
    processes: int = 1,
    on_done: Callable[[list[Staged]], None] = lambda staged: None,
) -> list[Staged]:
    """Copy every op with `job.threads` threads in each of `processes` processes; stop at the first error."""
    if not ops:
        return []
    entries = [op.entry for op in ops]
    if processes > 1:
        from mlhpc.staging.worker import copy_in_processes

        return copy_in_processes(entries, job, processes, on_done)
    try:
        with ThreadPoolExecutor(max_workers=max(1, job.threads)) as threads:
            try:
                work = chunks(entries, 4 * max(1, job.threads))
                return _collect([threads.submit(copy_chunk, job, chunk) for chunk in work], on_done)
            except BaseException:
                _stopping.add(job.dest_root)  # the copies under way stop (their partials removed)
                raise
    finally:
        _stopping.discard(job.dest_root)
        close_journal(job.dest_root)


def _check_stopping(job: CopyJob) -> None:
    if job.dest_root in _stopping:
        raise StagingError(f"copying into {job.dest_root} was stopped; rerun to resume")


def _collect(futures: list[Future[list[Staged]]], on_done: Callable[[list[Staged]], None]) -> list[Staged]:
    """Results as they come; at the first error, cancel what has not started and raise it."""
    done: list[Staged] = []
    try:
        for future in as_completed(futures):
            staged = future.result()
            done.extend(staged)
            on_done(staged)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return done
