"""Stops from outside as exceptions: SIGTERM and SIGHUP unwind a command like Ctrl-C, a killed
DataLoader worker becomes one typed error, and a few steps hold signals until they are done.

Here, at the bottom, so that the command line (which installs the handler) and the commands
(which tell a launcher's children how they were stopped) both import it without a cycle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType

from mlhpc.common.errors import MlhpcError


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, `kill`), raised like Ctrl-C so that `finally` blocks run."""

    signum: int = signal.SIGTERM
    word: str = "terminated"


class HungUp(Terminated):
    """SIGHUP (the terminal or the ssh session closed): stopped like SIGTERM, exit 129."""

    signum = signal.SIGHUP
    word = "hung up"


log = logging.getLogger(__name__)

STOP_SIGNALS = {signal.SIGTERM: Terminated, signal.SIGHUP: HungUp}
"""The signals `sigterm_raises` turns into exceptions (SIGINT is Python's KeyboardInterrupt)."""

_SHARER = os.path.join("multiprocessing", "resource_sharer.py")
"""Where multiprocessing hands a batch's shared memory between a DataLoader worker and the main
process (torch's file_descriptor sharing)."""

WORKER_KILLED_EXIT = 75
"""Exit code of a run whose DataLoader worker was killed: sysexits' EX_TEMPFAIL, "try again"
(resume), distinct from a refusal (2), a stop (130, 143, 129) and a crash (1)."""


class WorkerKilled(MlhpcError):
    """A DataLoader worker process died alone (the OOM killer's choice, or a `kill`): the run
    cannot go on, but the campaign can be resumed."""


def is_worker_death(error: BaseException) -> bool:
    """Whether `error` says a DataLoader worker died: torch's "DataLoader worker (pid 12) is
    killed by signal: Killed." (its SIGCHLD handler) or "... exited unexpectedly", or a connection
    reset while a batch's shared memory was handed over by multiprocessing (the worker died
    mid-handover, before torch noticed)."""
    if isinstance(error, RuntimeError):
        return str(error).startswith("DataLoader worker (pid")
    return _handover_cut(type(error), error.__traceback__)


def _handover_cut(kind: type[BaseException], tb: TracebackType | None) -> bool:
    """Whether a peer went mid-handover of a file descriptor: a connection reset or refused, or
    an end of file inside the connection's handshake (CI met that one: a worker killed between
    its connect and its answer), raised through multiprocessing's file-descriptor server."""
    if not issubclass(kind, (ConnectionError, EOFError)) or tb is None:
        return False
    return any(frame.filename.endswith(_SHARER) for frame in traceback.extract_tb(tb))


@contextlib.contextmanager
def worker_death_is_one_error() -> Iterator[None]:
    """A worker's death (`is_worker_death`), raised in the block, becomes WorkerKilled (its detail kept)."""
    try:
        yield
    except (RuntimeError, ConnectionError, EOFError) as e:
        if not is_worker_death(e):
            raise
        raise WorkerKilled(worker_death_line(e)) from e


def worker_death_line(error: BaseException) -> str:
    """The first line of torch's report, cut to what a person reads, with the likely cause."""
    detail = " ".join((str(error).splitlines() or [""])[0].split())[:200].rstrip(". ")
    return f"a data loader worker was killed (out of memory?): {detail}; lower data.num_workers if it recurs"


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated, SIGHUP HungUp, in this process's main thread while the command runs.

    Installed by `mlhpc.cli.main` only: a library caller and torch's launchers keep their own
    handlers, and a child forked meanwhile dies of the signal as it would without us.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        # DataLoader workers die of the same group SIGTERM; torch's SIGCHLD handler would raise
        # "worker killed" over Terminated in the middle of the cleanup (a traceback, exit 1). A
        # Python no-op, not SIG_DFL: a SIGCHLD already pending would print "ignored due to race".
        signal.signal(signal.SIGCHLD, lambda *_: None)
        raise STOP_SIGNALS[signal.Signals(signum)]

    previous = {signum: signal.signal(signum, terminate) for signum in STOP_SIGNALS}
    # Kept after the block: the file-descriptor server thread may die while the process exits.
    if not getattr(sys.excepthook, "peer_deaths_logged", False):
        sys.excepthook = _peer_deaths_logged(sys.excepthook)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _peer_deaths_logged(hook: Callable[..., object]) -> Callable[..., object]:
    """`hook` (sys.excepthook), except for multiprocessing's file-descriptor server thread, which
    reports a connection reset through it: a DataLoader worker killed mid-handover does that, in
    the main process or a sibling worker, and the command reports the death itself in one line.
    That traceback goes to the debug log instead of under the line."""

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> object:
        if _handover_cut(kind, tb):
            log.debug(
                "a loader worker's descriptor handover ended with its death", exc_info=(kind, error, tb)
            )
            return None
        return hook(kind, error, tb)

    excepthook.peer_deaths_logged = True  # type: ignore[attr-defined]
    return excepthook


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait (blocked in this thread) until the block ends, then arrive:
    for a step that must not be cut in two, such as renaming a folder and noting it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_further_stops() -> None:
    """For a command that caught a stop and now only says so and exits: a second Ctrl-C, SIGTERM
    or SIGHUP is ignored, where it would raise inside the exit's clean-up (torch's atexit
    handlers) and print a traceback under the one line. The process ends at once anyway."""
    if threading.current_thread() is threading.main_thread():
        for signum in HELD_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def die_with_parent(parent: int) -> None:
    """In a worker process (a staging copier, a characterize rank): have the kernel kill it when
    the thread that started it ends (Linux), and exit now if that parent is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
