"""Where a run's time goes: wall-clock seconds per phase, measured around the loop's own steps.

The phases are disjoint: each is timed where it runs, nothing is derived as a remainder, so the
sum of the phases against the measured total says how much time the breakdown does not see.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PHASES = (
    "init",
    "staging",
    "setup",
    "data_wait",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "evaluation",
)
"""In run order. init is before run_start (with staging, when the rules let it be there); setup
builds the loaders and the optimizer; communication is the loop's blocking collectives, while
DDP's gradient all-reduce overlaps and is charged to backward."""


@dataclass
class PhaseTimer:
    """Accumulates seconds per phase. `sync` runs before every clock read (torch.cuda.synchronize on
    a GPU, so that asynchronous kernels are charged to the phase that launched them)."""

    sync: Callable[[], None] | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise KeyError(f"unknown phase {name!r}; known: {', '.join(PHASES)}")
        self._sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - started

    def timed_iter(self, iterable: Any, name: str = "data_wait") -> Iterator[Any]:
        """Yield from `iterable`, charging the wait for each next item to `name`."""
        iterator = iter(iterable)
        while True:
            with self.phase(name):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item

    def _sync(self) -> None:
        if self.sync is not None:
            self.sync()


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """One run's time, as written next to its result log and read by `mlhpc report`."""

    seconds: dict[str, float]
    """Seconds per phase, in PHASES order."""
    time_to_train_s: float
    """run_start to run_stop, as MLLOG times it."""
    init_s: float
    """init_start to run_start (outside time-to-train)."""
    flops_per_sample: float
    """Forward + backward FLOPs of one training sample."""
    achieved_flops_per_s: float
    """Training FLOPs of all ranks over their forward + backward seconds, summed over ranks."""
    train_samples_seen: int
    """Training samples processed over all ranks and epochs."""
    overlapped_staging: dict[str, float | int] = field(default_factory=dict)
    """--staging overlap: the staging's seconds, how many of them ran beside training and how
    many training waited at the end (the "staging" phase), and the files read from the source for
    training (`staged._overlap_figures`)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """How the loop ran: device, precision, compile, memory format, loader, accumulation."""

    @property
    def total_s(self) -> float:
        """init + time-to-train: the wall time the phases should add up to."""
        return self.init_s + self.time_to_train_s

    @property
    def accounted_s(self) -> float:
        return sum(self.seconds.values())

    def shares(self) -> dict[str, float]:
        """Each phase as a fraction of init + time-to-train."""
        total = self.total_s or 1.0
        return {name: value / total for name, value in self.seconds.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": dict(self.seconds),
            "shares": self.shares(),
            "time_to_train_s": self.time_to_train_s,
            "init_s": self.init_s,
            "total_s": self.total_s,
            "unaccounted_s": self.total_s - self.accounted_s,
            "flops_per_sample": self.flops_per_sample,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "train_samples_seen": self.train_samples_seen,
            "overlapped_staging": dict(self.overlapped_staging),
            "settings": dict(self.settings),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Breakdown:
        return cls(
            seconds={name: float(data["seconds"].get(name, 0.0)) for name in PHASES},
            time_to_train_s=float(data["time_to_train_s"]),
            init_s=float(data["init_s"]),
            flops_per_sample=float(data.get("flops_per_sample", 0.0)),
            achieved_flops_per_s=float(data.get("achieved_flops_per_s", 0.0)),
            train_samples_seen=int(data.get("train_samples_seen", 0)),
            overlapped_staging={
                str(k): float(v) for k, v in (data.get("overlapped_staging") or {}).items()
            },
            settings=dict(data.get("settings") or {}),
        )
