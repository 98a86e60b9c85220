"""Horovod built while the tests run: `.ci/run` starts scripts/install_horovod.sh in the
background (about 5 minutes on 2 cores on a fresh machine) and names, in MLHPC_HOROVOD_BUILD, a
file it writes when the build has ended. The tests marked `horovod` run last and wait for
that file before they look for Horovod; without the variable nothing waits. `ci_order` also
puts the tests that build a container image first."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

BUILD_VARIABLE = "MLHPC_HOROVOD_BUILD"
WAIT_S = 1200  # .ci/run gives the build 900 s; this leaves room for the pip steps around it


def wait_for_horovod_build(wait_s: float = WAIT_S) -> None:
    """Return once the background build (if any) has ended; fail the test if it never does."""
    done = os.environ.get(BUILD_VARIABLE)
    if not done:
        return
    deadline = time.monotonic() + wait_s
    while not Path(done).exists():
        if time.monotonic() > deadline:
            pytest.fail(
                f"the background Horovod build did not end within {wait_s:.0f} s ({BUILD_VARIABLE}={done})"
            )
        time.sleep(2)


def ci_order(items: list[pytest.Item]) -> None:
    """The order the workers take tests in: those marked `image_build` first (their module builds a
    container image for minutes, which then overlaps the rest of the suite), those marked
    `horovod` last (their build may still run); the rest as collected (the sort is stable). The
    order never depends on the moment of collection: every xdist worker must collect the same."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("image_build") is not None:
            return 0
        return 2 if item.get_closest_marker("horovod") is not None else 1

    items.sort(key=rank)


def refuse_ungrouped(request: pytest.FixtureRequest) -> None:
    """Fail a module fixture whose tests `--dist loadgroup` did not keep together. xdist groups the
    tests marked `xdist_group` by a `@group` it appends to their ids, which pytest 9.2 no longer
    lets it write (pytest-xdist#1386): spread over the workers, each would build its own container
    image (minutes and gigabytes each) and their containers would fill the disk together."""
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup only
        return
    module = request.node.path
    lost = [item.nodeid for item in request.session.items if item.path == module and "@" not in item.nodeid]
    if lost:
        pytest.fail(
            f"--dist loadgroup did not keep {module.name}'s tests on one worker (pytest "
            f"{pytest.__version__}, pytest-xdist#1386): install the dev extra's pytest "
            "(pip install -e '.[dev]')",
            pytrace=False,
        )
