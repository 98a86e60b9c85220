"""Copying one file (or a run of them) from the source to node-local disk, in one pass.

Each file is read once into a page-aligned buffer, hashed from it and written from it (no
second read of source or copy). Many of these run at once in threads or worker processes, as
parallel.py chooses; what was copied is recorded in the journal (journal.py).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from mlhpc.common.errors import StagingError
from mlhpc.staging.buffered import KERNEL_COPY_MIN_BYTES, copy_buffered, copy_kernel, source_error
from mlhpc.staging.journal import journal
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry
from mlhpc.staging.origin import changed_while_copied, open_regular, recorded_identity
from mlhpc.staging.sink import (
    BUFFER_BYTES,
    BufferPool,
    FileSink,
    SinkOptions,
    Staged,
)

log = logging.getLogger(__name__)
DIRECT_READ_MIN_BYTES = 4 << 20
TAIL_PIECE_BYTES = 2 << 20
"""The last block's worth of a file read ahead goes in pieces this size: what is left to write
once its last read is in is one piece, not one block (see `read_spans`)."""
_pool = BufferPool()
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()
_stopping: set[str] = set()
"""Destinations whose copies stop at their next block: an error or an interruption (Ctrl-C,
SIGTERM) elsewhere, so that a large file's copy does not hold the exit for seconds."""


@dataclass(frozen=True)
class CopyJob:
    """What a worker needs to copy files (picklable for worker processes)."""

    src_root: str
    dest_root: str
    options: SinkOptions
    threads: int
    read_ahead: int = 1
    """Block reads in flight per large file (see `parallel.read_ahead_depth`)."""
    direct_reads: bool = True
    """Read large files with O_DIRECT where the source allows it (else through the page cache)."""
    kernel_copy: bool = False
    """On the buffered path, copy files of `KERNEL_COPY_MIN_BYTES` or more in the kernel."""

    @property
    def buffered(self) -> bool:
        """Whether files go the lean buffered path (`buffered.copy_buffered`)."""
        return not (self.direct_reads or self.options.direct_io or self.options.decompress)


def copy_file(job: CopyJob, entry: FileEntry, record: bool = True) -> Staged:
    """Copy one file: read it into an aligned buffer, hash it there, write it under a temporary name.

    Large files are also read with O_DIRECT where the source allows it: no page-cache pages to
    allocate and fill, which is most of the CPU cost of a buffered copy. A file smaller than a
    block is read whole into a buffer one byte larger, so that the read itself shows whether the
    file still has its listed size: no read-ahead hint, no read to find the end. With many small
    files these system calls are most of the work, and each one costs a hand-over of the GIL
    among the worker threads; the one `fstat` left gives the mode the copy keeps.
    """
    whole = entry.size < BUFFER_BYTES
    direct = job.direct_reads and entry.size >= DIRECT_READ_MIN_BYTES and not job.options.decompress
    source = _Source(os.path.join(job.src_root, entry.path), direct, sequential=not whole)
    buffer = _pool.get(entry.size + 1 if whole else BUFFER_BYTES)
    sink: FileSink | None = None
    try:
        info = os.fstat(source.fd)
        if not whole and info.st_size != entry.size:
            raise StagingError(
                f"staging source file {source.path} has {info.st_size} bytes, its listing says "
                f"{entry.size}; the source changed: regenerate its {MANIFEST_NAME} or stage again"
            )
        sink = FileSink(
            job.dest_root, entry, job.options, buffer, mode=info.st_mode, origin=recorded_identity(info)
        )
        while sink.path != entry.path and (data := os.read(source.fd, BUFFER_BYTES)):
            sink.write(data)
        if source.direct and job.read_ahead > 1:
            try:
                _read_ahead(source.fd, sink, entry.size, job, buffer)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                source.reopen_buffered()  # O_DIRECT refused this read: go on through the page cache
            os.lseek(source.fd, sink.received, os.SEEK_SET)  # the loop below reads what is left, if anything
        _read_rest(source, sink, entry, job)
        if (moved := changed_while_copied(source.path, info, source.fd)) is not None:
            raise moved
        staged = sink.finish()
        sink = None
        if record:
            journal(job.dest_root, job.options.run_token).record(staged)
        return staged
    except OSError as e:
        raise source_error(e, source.path) from e
    finally:
        if sink is not None:
            sink.abort()
        os.close(source.fd)
        _pool.put(buffer)


class _Source:
    """An open source file, read with O_DIRECT where asked and allowed, through the page cache
    from where O_DIRECT is refused."""

    def __init__(self, path: str, direct: bool, sequential: bool) -> None:
        self.path = path
        self.fd, self.direct = _open_source(path, direct, sequential)

    def reopen_buffered(self) -> None:
        os.close(self.fd)
        self.fd, self.direct = _open_source(self.path, False)


def _read_rest(source: _Source, sink: FileSink, entry: FileEntry, job: CopyJob) -> None:
    """Read what is left of the file into `sink`, block after block, until a short read brings
    its listed size (a file that grew reads on, and the sink refuses it)."""
    while sink.path == entry.path:
        _check_stopping(job)
        try:
            room = sink.room
            n = sink.read_from(source.fd)
            if not n or (n < room and sink.received == entry.size):
                break  # a short read that brings the listed size is the end of the file
        except OSError as e:
            if not (source.direct and e.errno == errno.EINVAL):
                raise
            source.reopen_buffered()  # O_DIRECT refused this read: go on through the page cache
            os.lseek(source.fd, sink.received, os.SEEK_SET)


def copy_chunk(job: CopyJob, entries: Sequence[FileEntry]) -> list[Staged]:
    """Copy a run of files one after another (a thread's unit of work: one hand-over per chunk,
    not per file), journaled together."""
    done: list[Staged] = []
    try:
        for entry in entries:
            _check_stopping(job)
            done.append(copy_one(job, entry))
    finally:  # what was renamed into place is journaled, also when a later file fails
        journal(job.dest_root, job.options.run_token).record_many(done)
    return done


def copy_one(job: CopyJob, entry: FileEntry) -> Staged:
    """Copy one file by the job's path: buffered (lean), or through `copy_file`; not journaled."""
    if job.buffered:
        o = job.options
        copy = copy_kernel if job.kernel_copy and entry.size >= KERNEL_COPY_MIN_BYTES else copy_buffered
        return copy(
            job.src_root,
            job.dest_root,
            entry,
            o.algorithm,
            o.umask,
            lambda: _check_stopping(job),
            o.run_token,
        )
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
                return open_regular(path, flags | os.O_DIRECT), True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        fd = open_regular(path, flags)
    except OSError as e:
        raise source_error(e, path) from e
    if sequential and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd, False


def request_stop(dest_root: str) -> None:
    """Have the copies into `dest_root` under way stop at their next block (their partials removed)."""
    _stopping.add(dest_root)


def withdraw_stop(dest_root: str) -> None:
    """Let the next copies into `dest_root` run (after the ones told to stop have ended)."""
    _stopping.discard(dest_root)


def _check_stopping(job: CopyJob) -> None:
    if job.dest_root in _stopping:
        raise StagingError(f"copying into {job.dest_root} was stopped; rerun to resume")
