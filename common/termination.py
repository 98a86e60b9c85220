"""SIGTERM as an exception: a scheduler's time limit or `kill` unwinds a command like Ctrl-C.

Here, at the bottom, so that the command line (which installs the handler) and the commands
(which tell a launcher's children how they were stopped) both import it without a cycle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, `kill`), raised like Ctrl-C so that `finally` blocks run."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated in this process's main thread while the command runs.

    Installed by `mlhpc.cli.main` only: a library caller and torch's launchers keep their own
    handlers, and a child forked meanwhile dies of SIGTERM as it would without us.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        # DataLoader workers die of the same group SIGTERM; torch's SIGCHLD handler would raise
        # "worker killed" over Terminated in the middle of the cleanup (a traceback, exit 1). A
        # Python no-op, not SIG_DFL: a SIGCHLD already pending would print "ignored due to race".
        signal.signal(signal.SIGCHLD, lambda *_: None)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
