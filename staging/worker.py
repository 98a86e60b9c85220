"""Copy worker processes: `python -m mlhpc.staging.worker`, fed batches of files over a pipe.

Plain subprocesses rather than multiprocessing: they do not re-run the caller's main module
and do not fork a process that holds torch or MPI threads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from mlhpc.common.errors import StagingError
from mlhpc.staging.copy import CopyJob, close_journal, copy_file, journal
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.sink import SinkOptions, Staged

_BATCH_FILES = 64
_BATCH_BYTES = 256 << 20


def batches(entries: Sequence[FileEntry]) -> list[list[FileEntry]]:
    """Consecutive runs of files, up to 64 files or 256 MiB each."""
    out: list[list[FileEntry]] = []
    current: list[FileEntry] = []
    size = 0
    for entry in entries:
        if current and (len(current) >= _BATCH_FILES or size + entry.size > _BATCH_BYTES):
            out.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.size
    if current:
        out.append(current)
    return out


def copy_in_processes(
    entries: Sequence[FileEntry],
    job: CopyJob,
    processes: int,
    on_done: Callable[[list[Staged]], None],
) -> list[Staged]:
    """Copy `entries` with `processes` worker processes of `job.threads` threads each."""
    todo = batches(entries)
    lock = threading.Lock()
    done: list[Staged] = []
    errors: list[str] = []
    setup = json.dumps({**asdict(job), "options": asdict(job.options)})

    def drive() -> None:
        worker = subprocess.Popen(
            [sys.executable, "-m", "mlhpc.staging.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert worker.stdin is not None and worker.stdout is not None
        try:
            worker.stdin.write(setup + "\n")
            while True:
                with lock:
                    if errors or not todo:
                        return
                    batch = todo.pop()
                worker.stdin.write(json.dumps([[f.path, f.size, f.checksum] for f in batch]) + "\n")
                reply = json.loads(worker.stdout.readline() or '{"error": "a copy worker process died"}')
                with lock:
                    if "error" in reply:
                        errors.append(reply["error"])
                        return
                    staged = [Staged(*fields) for fields in reply["staged"]]
                    done.extend(staged)
                on_done(staged)
        finally:
            worker.stdin.close()
            worker.wait()

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(min(processes, len(todo)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise StagingError(errors[0])
    return done


def main() -> None:
    """The worker: read the job, then for each batch line copy it and answer one line."""
    setup = json.loads(sys.stdin.readline())
    job = CopyJob(**{**setup, "options": SinkOptions(**setup["options"])})
    with ThreadPoolExecutor(max_workers=max(1, job.threads)) as pool:
        for line in sys.stdin:
            entries = [FileEntry(*fields) for fields in json.loads(line)]
            try:
                staged = list(pool.map(lambda entry: copy_file(job, entry), entries))
                journal(job.dest_root).flush()  # journaled before reported: a reply is a promise
                reply = {"staged": [list(asdict(s).values()) for s in staged]}
            except StagingError as e:
                reply = {"error": str(e)}
            print(json.dumps(reply), flush=True)
    close_journal(job.dest_root)


if __name__ == "__main__":
    main()
