"""Running one rank's copies at once: threads in this process, or worker processes
(`python -m mlhpc.staging.parallel`) fed batches of files over a pipe.

Plain subprocesses rather than multiprocessing: they do not re-run the caller's main module
and do not fork a process that holds torch or MPI threads. The workers run in their own process
group, so a Ctrl-C at the terminal reaches the parent only; the parent terminates them when it
is interrupted, and the kernel kills them when the parent dies (SIGKILL included), so no worker
prints a traceback or writes on behind a rerun. A file a worker was writing stays as a
`.mlhpc-partial`, which the rerun removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict

from mlhpc.common.cluster.termination import die_with_parent
from mlhpc.common.errors import StagingError
from mlhpc.staging.engine import Staged, copy_file, copy_once, request_stop, stop_if_asked, withdraw_stop
from mlhpc.staging.journal import close_journal, journal
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.request import CopyOptions

CHUNK_BYTES = 64 << 20
_BATCH_FILES = 64
_BATCH_BYTES = 256 << 20


def run_copies(
    entries: Sequence[FileEntry],
    src_root: str,
    dest_root: str,
    options: CopyOptions,
    on_done: Callable[[list[Staged]], None] = lambda staged: None,
) -> list[Staged]:
    """Copy every entry with `options.threads` threads in each of `options.processes`
    processes, journaled; stop at the first error."""
    if not entries:
        return []
    if options.processes > 1:
        return _copy_in_processes(entries, src_root, dest_root, options, on_done)
    try:
        with ThreadPoolExecutor(max_workers=max(1, options.threads)) as threads:
            try:
                work = chunks(entries, 4 * max(1, options.threads))
                futures = [threads.submit(copy_chunk, src_root, dest_root, options, c) for c in work]
                return _collect(futures, on_done)
            except BaseException:
                request_stop(dest_root)  # the copies under way stop (their partials removed)
                raise
    finally:
        withdraw_stop(dest_root)
        close_journal(dest_root)


def copy_chunk(src_root: str, dest_root: str, options: CopyOptions, entries: Sequence[FileEntry]) -> list[Staged]:
    """Copy a run of files one after another (a thread's unit of work: one hand-over per chunk,
    not per file), journaled together."""
    done: list[Staged] = []
    try:
        for entry in entries:
            stop_if_asked(dest_root)
            if options.claims:  # training may have copied it already (--staging overlap)
                done.append(copy_once(src_root, dest_root, entry, options, "staging")[0])
            else:
                done.append(copy_file(src_root, dest_root, entry, options))
    finally:  # what was renamed into place is journaled, also when a later file fails
        journal(dest_root, options.run_token).record_many(done)
    return done


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


# ---------------------------------------------------------------- worker processes
def _copy_in_processes(
    entries: Sequence[FileEntry],
    src_root: str,
    dest_root: str,
    options: CopyOptions,
    on_done: Callable[[list[Staged]], None],
) -> list[Staged]:
    """The workers are started from the calling thread, which outlives them: the kernel's
    parent-death signal is tied to the thread that started a process, not to the process."""
    setup = json.dumps({"src_root": src_root, "dest_root": dest_root, "options": asdict(options)})
    feed = _Feed(consecutive_runs(entries, _BATCH_FILES, _BATCH_BYTES), setup, on_done)
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(min(options.processes, len(feed.todo))):
            workers.append(_start_worker())
        threads = [threading.Thread(target=feed.drive, args=(w,), daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): stop the workers, quietly, then go on up
        with feed.lock:
            feed.todo.clear()
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.kill()
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.wait(timeout=10)
        raise
    if feed.errors:
        raise StagingError(feed.errors[0])
    return feed.done


class _Feed:
    """The batches left to copy, shared by the threads that drive the workers (one thread a
    worker), and what the workers staged or the first errors they met."""

    def __init__(self, todo: list[list[FileEntry]], setup: str, on_done: Callable[[list[Staged]], None]) -> None:
        self.todo = todo
        self.setup = setup
        self.on_done = on_done
        self.lock = threading.Lock()
        self.done: list[Staged] = []
        self.errors: list[str] = []

    def drive(self, worker: subprocess.Popen[str]) -> None:
        """Send `worker` the job, then batch after batch, until none is left or one failed."""
        assert worker.stdin is not None and worker.stdout is not None
        try:
            worker.stdin.write(self.setup + "\n")
            while True:
                with self.lock:
                    if self.errors or not self.todo:
                        return
                    batch = self.todo.pop()
                worker.stdin.write(json.dumps([[f.path, f.size, f.checksum] for f in batch]) + "\n")
                reply = json.loads(worker.stdout.readline() or '{"error": "a copy worker process died"}')
                with self.lock:
                    if "error" in reply:
                        self.errors.append(reply["error"])
                        return
                    staged = [Staged(*fields) for fields in reply["staged"]]
                    self.done.extend(staged)
                self.on_done(staged)
        except (OSError, ValueError):  # its pipe broke: it died (or was stopped)
            with self.lock:
                self.errors.append("a copy worker process died; rerun to resume")
        finally:
            with contextlib.suppress(OSError):
                worker.stdin.close()
            worker.wait()


def _start_worker() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlhpc.staging.parallel", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the parent alone
    )



def main() -> None:
    """A worker: read the job, then for each batch line copy it and answer one line."""
    if len(sys.argv) > 1:
        die_with_parent(int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker stops
    try:
        _serve()
    except (BrokenPipeError, KeyboardInterrupt):  # the parent is gone or stopping: nothing to report
        os._exit(1)


def _serve() -> None:
    line = sys.stdin.readline()
    if not line:
        return  # the parent went before it sent the job
    setup = json.loads(line)
    src_root, dest_root, options = setup["src_root"], setup["dest_root"], CopyOptions(**setup["options"])
    with ThreadPoolExecutor(max_workers=max(1, options.threads)) as pool:
        for line in sys.stdin:
            entries = [FileEntry(*fields) for fields in json.loads(line)]
            try:
                work = chunks(entries, max(1, options.threads))
                done = pool.map(lambda chunk: copy_chunk(src_root, dest_root, options, chunk), work)
                staged = [s for chunk in done for s in chunk]
                journal(dest_root, options.run_token).flush()  # journaled before reported: a reply is a promise
                reply = {"staged": [list(asdict(s).values()) for s in staged]}
            except (StagingError, OSError) as e:
                reply = {"error": str(e)}
            print(json.dumps(reply), flush=True)
    with contextlib.suppress(StagingError):  # every batch was flushed before its reply
        close_journal(dest_root)


if __name__ == "__main__":
    main()
