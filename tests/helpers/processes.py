"""Another process holding something (a folder lock, a script's resource) while a test goes on, and how a
child a test Ctrl-C's must be started."""

from __future__ import annotations

import faulthandler
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from tests.helpers.cli import cli_env

_HOLD_LOCK = """
import sys
from pathlib import Path
from mlhpc.common.safeio.locks import folder_lock
with folder_lock(Path(sys.argv[1]), "a test's hold", "let the test go on"):
    print("held", flush=True)
    sys.stdin.read()
"""


def lock_held_elsewhere(folder: Path) -> AbstractContextManager[int]:
    """`folder`'s mlhpc lock held by another process for the block; yields that process's pid."""
    return held_by_another_process(_HOLD_LOCK, str(folder))


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = 60,
    proc: subprocess.Popen[str] | None = None,
    interval: float = 0.01,
) -> None:
    """Until `condition()` holds; AssertionError naming `what` after `timeout` seconds, or at once
    (with its output) when `proc`, the process that should make it hold, has ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"no {what}: the process ended first", proc.communicate())
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@contextmanager
def no_hang(seconds: float = 60) -> Iterator[None]:
    """Ends the test process with every thread's stack if the block blocks: a FIFO read under
    h5py holds the GIL, so no Python-level timeout could fire (a regression fails, never hangs)."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def ctrl_c_as_at_a_terminal() -> None:
    """Popen's preexec_fn for a child a test Ctrl-C's: SIGINT back to its default. A job started
    in the background of a non-interactive shell (`.ci/run &`, nohup) inherits SIGINT ignored,
    and Python then never raises KeyboardInterrupt: the child would run on, as if never stopped."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def held_by_another_process(script: str, *args: str) -> Iterator[int]:
    """Runs `script` (which prints "held" once it holds something, then waits on stdin) in another
    process for the block; yields its pid, and lets it go at the end."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.communicate("")
