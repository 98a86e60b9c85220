"""AIPerf's score of a run over time, as its `scripts/reports/score.py` (`process_log`) computes it:

    score(window) = total ops of the epochs completed before the window's end x |ln(1 - best accuracy)|
                    / (latest completed epoch's time - start)

over windows ending 0.2, 0.3, ... hours after the start; the last window's score is AIPerf's result.
Pure functions over epoch records; the per-image ops come from `mlhpc.benchmarks.aiperf.ops_count`.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_ACCURACY = 1 - 1e-6
"""Accuracy used in ln(1 - accuracy) at most: at 1.0 AIPerf's math.log raises; this caps the
regulator |ln(1 - accuracy)| at about 13.8 instead (Window.best_accuracy keeps the real value)."""


class PerImageOps(Protocol):
    """Ops one image costs (ops_count.OpsPerImage has this shape)."""

    @property
    def eval(self) -> float: ...

    @property
    def train(self) -> float: ...


@dataclass(frozen=True)
class EpochRecord:
    """One evaluated epoch of a trial, a line of AIPerf's trial.log."""

    trial: str
    """NNI trial id."""
    hp: int
    """Hyperparameter round of the trial (AIPerf's `<hp>.json`), 0 first."""
    epoch: int
    """Epoch number, 1 first; AIPerf never takes its epochs from a record of epoch 0."""
    time: float
    """When the epoch's evaluation ended, unix seconds."""
    accuracy: float
    """Top-1 validation accuracy, 0..1."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.accuracy) and 0 <= self.accuracy <= 1):
            raise ValueError(f"accuracy={self.accuracy} of trial {self.trial!r} is not in 0..1; "
                             "give top-1 as a fraction, not a percentage")
        if self.epoch < 0 or self.hp < 0:
            raise ValueError(f"epoch={self.epoch}, hp={self.hp} of trial {self.trial!r}: both count from 0")
        if not math.isfinite(self.time):
            raise ValueError(f"time={self.time} of trial {self.trial!r} is not a finite unix time")


@dataclass(frozen=True)
class Window:
    """AIPerf's figures for the records before one window's end."""

    hours: float
    """Window end, hours after the start (0.2, 0.3, ...: numpy.arange's values, as AIPerf's)."""
    run_seconds: float
    """Latest completed epoch's time minus the start (AIPerf's real_time, not the window length);
    0 when no epoch completed yet."""
    ops: float
    """Operations of the epochs completed: (eval x eval images + train x train images) x epochs."""
    ops_per_second: float
    """ops / run_seconds (AIPerf's GFLOPS x 1e9); 0 when run_seconds is not positive."""
    best_accuracy: float
    """Best accuracy of any record in the window (AIPerf's Error is 100 - 100 x this)."""
    score: float
    """ops x |ln(1 - best_accuracy)| / run_seconds (AIPerf's Score x 1e9); 0 when run_seconds is not positive."""


def windows(
    records: Sequence[EpochRecord],
    ops: Mapping[tuple[str, int], PerImageOps],
    start: float,
    train_images: int = 1_280_000,
    eval_images: int = 50_000,
    first_hours: float = 0.2,
    step_hours: float = 0.1,
    duration_hours: float | None = None,
) -> list[Window]:
    """AIPerf's score windows of a run started at `start` (unix seconds), ops keyed by (trial, hp).

    `records` in AIPerf's order: trials by NNI parameter id, each trial's records in log order.
    The order decides ties between records of one (trial, hp) at the same second, and the default
    duration: AIPerf's `dur` is the time of the last record of the last trial that has records, so
    records in time order give the latest time overall. Windows end at
    numpy.arange(first_hours, duration_hours + step_hours, step_hours); no windows without records
    and no duration. ValueError when a (trial, hp) with a completed epoch has no ops (AIPerf would
    count it as 0).
    """
    if duration_hours is None:
        if not records:
            return []
        duration_hours = (records[-1].time - start) / 3600.0
    runs: dict[tuple[str, int], list[EpochRecord]] = {}
    for record in records:
        runs.setdefault((record.trial, record.hp), []).append(record)
    ends = np.arange(first_hours, duration_hours + step_hours, step_hours)
    return [_window(runs, ops, start, float(hours), train_images, eval_images) for hours in ends]


def final(scored: Sequence[Window]) -> Window | None:
    """AIPerf's result: the last window (None when the run had none)."""
    return scored[-1] if scored else None


def valid(best_accuracy: float, threshold: float) -> bool:
    """Whether the run's best accuracy reached the quality threshold."""
    return best_accuracy >= threshold


def _window(
    runs: Mapping[tuple[str, int], Sequence[EpochRecord]],
    ops: Mapping[tuple[str, int], PerImageOps],
    start: float,
    hours: float,
    train_images: int,
    eval_images: int,
) -> Window:
    stop = _window_end(start, hours)
    seen = [record for run in runs.values() for record in run if record.time < stop]
    latest = max((record.time for record in seen), default=None)
    best = max((record.accuracy for record in seen), default=0.0)
    total = 0.0
    for key, run in runs.items():
        epochs = _epochs(run, stop)
        if epochs == 0:
            continue
        if key not in ops:
            raise ValueError(f"no ops for trial {key[0]!r} hp {key[1]}, which completed {epochs} epochs; "
                             "count its model.json with ops_count.ops_per_image")
        per_image = ops[key]
        total += (float(per_image.eval) * eval_images + float(per_image.train) * train_images) * epochs
    run_seconds = 0.0 if latest is None else latest - start
    if run_seconds <= 0:
        # AIPerf divides by latest - start anyway: -start with no record yet, a ZeroDivisionError at 0.
        return Window(hours, max(run_seconds, 0.0), total, 0.0, best, 0.0)
    regulator = abs(math.log(1 - min(best, MAX_ACCURACY), math.e))  # score.py's expression
    return Window(hours, run_seconds, total, total / run_seconds, best, total * regulator / run_seconds)


def _window_end(start: float, hours: float) -> float:
    # score.py adds timedelta(hours=...) to the start, which rounds the window to whole microseconds
    # (0.30000000000000004 h is 1080 s exactly); AIPerf works in local time, this in UTC.
    delta = datetime.timedelta(hours=hours)
    return start + (delta.days * 86_400 + delta.seconds) + delta.microseconds / 1e6


def _epochs(run: Iterable[EpochRecord], stop: float) -> int:
    """Epochs of the (trial, hp)'s latest record before `stop` (the first of equal times); a record of
    epoch 0 becomes the latest yet leaves the epochs of the one before it (score.py's find_max_acc)."""
    latest, epochs = 0.0, 0
    for record in run:
        if record.time < stop and record.time > latest:
            latest = record.time
            if record.epoch != 0:
                epochs = record.epoch
    return epochs
