"""What a long generation shows while it runs: the bytes in its folder against the expected size,
and the time left."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mlhpc.dataset_size import human_size


# ---------------------------------------------------------------- progress while generating
class GenerationProgress:
    """While a generation runs: after a few quiet seconds, how much of `expected` bytes is written
    and the time left, as a bar at a terminal or a line every PLAIN_EVERY_S in a job's output. It
    measures the folder from a thread, so any generator's files count."""

    QUIET_S = 3.0
    PLAIN_EVERY_S = 30.0

    def __init__(self, folder: Path, expected: int | None, stream: Any = None) -> None:
        self.folder, self.expected = Path(folder), expected
        # stdout, with the run's other progress: stderr keeps a refusal or a stop to its one line
        self.stream = stream if stream is not None else sys.stdout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0

    def __enter__(self) -> GenerationProgress:
        if self.expected:
            self._thread = threading.Thread(target=self._watch, name="mlhpc-generation-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        started = time.monotonic()
        if self._stop.wait(self.QUIET_S):
            return
        terminal = getattr(self.stream, "isatty", lambda: False)()
        every = 1.0 if terminal else self.PLAIN_EVERY_S
        while True:
            t0 = time.monotonic()
            written = folder_bytes(self.folder)
            # A walk of a huge folder is slow; wait several walks' time so it stays a small share.
            line = progress_text(written, self.expected or 1, time.monotonic() - started)
            if terminal:
                self.stream.write(f"\r{line}\x1b[K")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
            self.lines += 1
            if self._stop.wait(max(every, 10 * (time.monotonic() - t0))):
                break
        if terminal:
            self.stream.write("\n")
            self.stream.flush()


def progress_text(written: int, expected: int, elapsed_s: float) -> str:
    """`generating: 1.2 GB of 9.9 TB (0 %), 2:13:05 left` (no estimate before any bytes)."""
    from mlhpc.common.training.progress import clock

    share = min(written / expected, 1.0) if expected > 0 else 1.0
    left = f", {clock(elapsed_s * (1 - share) / share)} left" if share > 0 else ""
    return (
        f"generating: {human_size(written, round_up=False)} of about {human_size(expected)} "
        f"({share * 100:.0f} %){left}"
    )


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` now (files vanishing meanwhile are skipped)."""
    total = 0
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total
