"""Nothing silent for long: a step that may take seconds says what it is doing once it has taken
`after_s` (a spinner at a terminal, one plain line into a log file), and nothing when it is quick."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

SILENT_S = 2.0
"""How long a command may be silent before it says what it is doing."""


@contextlib.contextmanager
def say_if_slow(what: str, after_s: float = SILENT_S, stream: TextIO | None = None) -> Iterator[None]:
    """Run the body; if it is still running after `after_s`, show `what` ("reading 40 logs"):
    at a terminal a rich spinner on `stream` (stderr by default) until the body ends, else one
    plain line `mlhpc: <what> ...`, flushed so that a batch log shows it at once."""
    stream = sys.stderr if stream is None else stream
    done = threading.Event()
    at_terminal = hasattr(stream, "isatty") and stream.isatty()
    spinner: list[object] = []
    lock = threading.Lock()

    def speak() -> None:
        if done.wait(after_s):
            return
        with lock:
            if done.is_set():
                return
            if at_terminal:
                from rich.console import Console

                status = Console(file=stream).status(f"{what} ...")
                status.start()
                spinner.append(status)
            else:
                print(f"mlhpc: {what} ...", file=stream, flush=True)

    thread = threading.Thread(target=speak, name="say-if-slow", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with lock:
            done.set()
            for status in spinner:
                status.stop()  # type: ignore[attr-defined]
        thread.join()
