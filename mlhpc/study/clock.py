"""The user's clock for a copy: its wall time without `sync`, then until every staged file has
been read once, and a sync-inclusive figure only as a labelled extra; medians over repeats."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.study import dataset


@dataclass(frozen=True, kw_only=True)
class Timing:
    """One copy on the user's clock, with the sync-inclusive time as a labelled extra."""

    wall_s: float
    """The command's wall time, as the user waits for it (no `sync`)."""
    read_once_s: float | None = None
    """`wall_s` plus reading every staged file once, as a first epoch does; None for the raw disk
    measures, which stage nothing."""
    extra_with_sync_s: float | None = None
    """Extra, not the user's clock: `wall_s` plus a `sync` until the copy is on disk (timed after
    the read); None for the raw disk measures."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Timing:
        """The timing a `run_plan` result row carries."""
        return cls(**{name: row.get(name) for name in TIMING_FIELDS})


TIMING_FIELDS = ("wall_s", "read_once_s", "extra_with_sync_s")


def user_clock(copy: Callable[[], object], dest: Path) -> Timing:
    """Time `copy` as the user waits for it, then read `dest` once, then `sync` (the extra).

    `copy` may return its own seconds (ranks timed inside their launch), else it is timed here.
    """
    started = time.perf_counter()
    own = copy()
    copied = time.perf_counter()
    if isinstance(own, float):
        started = copied - own
    dataset.read_all(dest)
    read = time.perf_counter()
    os.sync()
    return Timing(
        wall_s=copied - started,
        read_once_s=read - started,
        extra_with_sync_s=copied - started + time.perf_counter() - read,
    )


def timed(action: Callable[[], object], cold_source: Path | None = None) -> float:
    """Seconds for `action` plus a `sync`: the raw disk measures, whose writes are O_DIRECT and
    fsynced, so that the sync finds nothing left of theirs to write. `cold_source` is evicted
    from the page cache first (for a file system that refuses O_DIRECT)."""
    if cold_source is not None:
        dataset.evict(cold_source)
    started = time.perf_counter()
    action()
    os.sync()
    return time.perf_counter() - started


def median_timing(timings: Sequence[Timing]) -> Timing:
    """Each figure's median over `timings` (a figure missing from any of them stays None)."""

    def median(values: list[float | None]) -> float | None:
        return None if None in values else statistics.median(v for v in values if v is not None)

    return Timing(
        wall_s=statistics.median(t.wall_s for t in timings),
        read_once_s=median([t.read_once_s for t in timings]),
        extra_with_sync_s=median([t.extra_with_sync_s for t in timings]),
    )


def medians(times: dict[str, list[Timing]]) -> dict[str, Timing]:
    return {name: median_timing(values) for name, values in times.items()}
