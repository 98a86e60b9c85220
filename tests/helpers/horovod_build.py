"""Horovod built while the tests run: `.ci/run` starts scripts/install_horovod.sh in the
background (about 5 minutes on 2 cores on a fresh machine) and names, in MLHPC_HOROVOD_BUILD, a
file it writes when the build has ended. The tests marked `horovod` then run last and wait for
that file before they look for Horovod; without the variable nothing waits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

BUILD_VARIABLE = "MLHPC_HOROVOD_BUILD"
WAIT_S = 1200  # .ci/run gives the build 600 s; a busy machine can take twice that


def build_pending() -> bool:
    """Whether a background Horovod build was started and has not ended yet."""
    done = os.environ.get(BUILD_VARIABLE)
    return bool(done) and not Path(done).exists()


def wait_for_horovod_build(wait_s: float = WAIT_S) -> None:
    """Return once the background build (if any) has ended; fail the test if it never does."""
    done = os.environ.get(BUILD_VARIABLE)
    if not done:
        return
    deadline = time.monotonic() + wait_s
    while not Path(done).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the background Horovod build did not end within {wait_s:.0f} s ({BUILD_VARIABLE}={done})")
        time.sleep(2)


def horovod_last(items: list[pytest.Item]) -> None:
    """Move the `horovod` tests to the end while their build runs: the others go first."""
    if build_pending():
        items.sort(key=lambda item: item.get_closest_marker("horovod") is not None)
