"""How one rank's copies run at once: threads in this process or worker processes (worker.py),
how many, and with how many reads in flight. The one place that chooses, and runs them."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace

from mlhpc.staging.copy import CopyJob, chunks, copy_chunk, request_stop, withdraw_stop
from mlhpc.staging.journal import close_journal
from mlhpc.staging.plan import CopyOp
from mlhpc.staging.sink import BUFFER_BYTES, Staged

MAX_READ_AHEAD = 4
"""Block reads in flight per large file, at most. One at a time leaves a disk that wants a deep
queue idle when there are fewer files than workers (8 x 128 MiB files here: +32 %)."""
BUFFER_SHARE = 0.5
"""The direct path's buffers take at most this share of the memory the node may use."""
MANY_FILES = 1024
"""From this many files on, the Python work per file wants more CPUs than one process has."""


def read_ahead_depth(workers: int, files: int) -> int:
    """Reads in flight per large file: the workers left idle by a short file list go to reading
    ahead, so reads in flight (and buffers held) stay at about `workers`."""
    return max(1, min(MAX_READ_AHEAD, workers // max(1, min(files, workers))))


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


def auto_processes(files: int, local_size: int) -> int:
    """Worker processes per rank: with many files the Python work per file needs more CPUs."""
    if files < MANY_FILES:
        return 1
    return max(1, min(8, 2 * (os.cpu_count() or 1) // local_size))


def shape(
    job: CopyJob,
    sizes: Sequence[int],
    *,
    workers: int,
    processes: int | None,
    local_size: int,
    source_cached: bool = False,
    memory_bytes: int | None = None,
) -> tuple[CopyJob, int]:
    """`job` with its threads per process and reads in flight set, and the number of processes,
    for copying files of `sizes` with `workers` copies at once (`processes` None or 0: chosen).

    The lean buffered path stays in one process (its per-file work is small) and, when the
    source is cached, to the CPUs: threads beyond them only queue. The direct path's buffers
    fit in `memory_bytes`."""
    if source_cached and job.buffered:
        workers = min(workers, os.cpu_count() or 1)
    automatic = 1 if job.buffered else auto_processes(len(sizes), local_size)
    count = max(1, min(processes or automatic, workers))
    depth = read_ahead_depth(workers, len(sizes))
    if not job.buffered:
        workers, depth = fit_in_memory(workers, sizes, memory_bytes)
        count = min(count, workers)
    return replace(job, threads=-(-workers // count), read_ahead=depth), count


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
        # Imported here: the worker processes run `python -m mlhpc.staging.worker`, which must not
        # find it imported already by the package (runpy warns, and it would be loaded twice).
        from mlhpc.staging.worker import copy_in_processes

        return copy_in_processes(entries, job, processes, on_done)
    try:
        with ThreadPoolExecutor(max_workers=max(1, job.threads)) as threads:
            try:
                work = chunks(entries, 4 * max(1, job.threads))
                return _collect([threads.submit(copy_chunk, job, chunk) for chunk in work], on_done)
            except BaseException:
                request_stop(job.dest_root)  # the copies under way stop (their partials removed)
                raise
    finally:
        withdraw_stop(job.dest_root)
        close_journal(job.dest_root)


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
