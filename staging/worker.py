"""Copy worker processes: `python -m mlhpc.staging.worker`, fed batches of files over a pipe.

Plain subprocesses rather than multiprocessing: they do not re-run the caller's main module
and do not fork a process that holds torch or MPI threads.

Stopping: the workers run in their own process group, so a Ctrl-C at the terminal reaches the
parent only; the parent terminates them when it is interrupted, and the kernel kills them when
the parent dies (SIGKILL included), so no worker prints a traceback or writes on behind a rerun.
A file a worker was writing stays as a `.mlhpc-partial`, which the rerun removes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from mlhpc.common.errors import StagingError
from mlhpc.staging.copy import CopyJob, chunks, consecutive_runs, copy_chunk
from mlhpc.staging.journal import close_journal, journal
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.sink import SinkOptions, Staged

_BATCH_FILES = 64
_BATCH_BYTES = 256 << 20


def batches(entries: Sequence[FileEntry]) -> list[list[FileEntry]]:
    """Consecutive runs of files, up to 64 files or 256 MiB each."""
    return consecutive_runs(entries, _BATCH_FILES, _BATCH_BYTES)


def copy_in_processes(
    entries: Sequence[FileEntry],
    job: CopyJob,
    processes: int,
    on_done: Callable[[list[Staged]], None],
) -> list[Staged]:
    """Copy `entries` with `processes` worker processes of `job.threads` threads each.

    The workers are started from the calling thread, which outlives them: the kernel's
    parent-death signal is tied to the thread that started a process, not to the process."""
    feed = _Feed(entries, job, on_done)
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(min(processes, len(feed.todo))):
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

    def __init__(
        self, entries: Sequence[FileEntry], job: CopyJob, on_done: Callable[[list[Staged]], None]
    ) -> None:
        self.todo = batches(entries)
        self.lock = threading.Lock()
        self.done: list[Staged] = []
        self.errors: list[str] = []
        self.setup = json.dumps({**asdict(job), "options": asdict(job.options)})
        self.on_done = on_done

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
        [sys.executable, "-m", "mlhpc.staging.worker", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the parent alone
    )


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when the thread that started it ends (Linux); exit now if
    the parent is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def main() -> None:
    """The worker: read the job, then for each batch line copy it and answer one line."""
    if len(sys.argv) > 1:
        _die_with_parent(int(sys.argv[1]))
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
    job = CopyJob(**{**setup, "options": SinkOptions(**setup["options"])})
    with ThreadPoolExecutor(max_workers=max(1, job.threads)) as pool:
        for line in sys.stdin:
            entries = [FileEntry(*fields) for fields in json.loads(line)]
            try:
                work = chunks(entries, max(1, job.threads))
                staged = [s for done in pool.map(lambda chunk: copy_chunk(job, chunk), work) for s in done]
                # journaled before reported: a reply is a promise
                journal(job.dest_root, job.options.run_token).flush()
                reply = {"staged": [list(asdict(s).values()) for s in staged]}
            except (StagingError, OSError) as e:
                reply = {"error": str(e)}
            print(json.dumps(reply), flush=True)
    with contextlib.suppress(StagingError):  # every batch was flushed before its reply
        close_journal(job.dest_root)


if __name__ == "__main__":
    main()
