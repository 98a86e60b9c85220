"""Pure scoring functions, as `mlperf_logging.result_summarizer` computes HPC scores.

None of them changes its inputs or touches the file system (HPC AI500's target excepted: it is read
once from the benchmark's rule file, `submission_checker/hpc_ai500.py`). The RCP scaling factor (from
`rcp.check_rcp`) is applied in `apply_scaling_factor`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

# HPC AI500's formulas and target live in common/, beside the benchmark that logs the same score.
from mlhpc.submission_checker.hpc_ai500 import run_flops
from mlhpc.submission_checker.hpc_ai500 import target as hpc_ai500_target
from mlhpc.submission_checker.hpc_ai500 import valid_flops as valid_flops_penalty

if TYPE_CHECKING:
    from .logparse import RunLog

# Runs olympic scoring may drop for an HPC benchmark (the summarizer allows 4 for unet3d only).
MAX_DROPPED_RUNS = 1
MAX_TIME_TO_TRAIN_MIN = 366 * 24 * 60.0
"""A run longer than a year is a damaged or forged log, not a time to train."""


def impossible_minutes(minutes: float) -> str | None:
    """Why `minutes` cannot be a time to train (not finite, not positive, over a year), or None."""
    if not math.isfinite(minutes):
        return f"the time to train is {minutes!r}"
    if minutes < 0:
        return "run_stop is earlier than run_start: the time to train is negative"
    if minutes == 0:
        return "run_stop is at run_start: the time to train is zero"
    if minutes > MAX_TIME_TO_TRAIN_MIN:
        return f"the time to train is {minutes / 60 / 24:.4g} days, more than a year"
    return None


@dataclass(frozen=True)
class RunTiming:
    """One result file as scoring sees it."""

    file: str
    run_start_ms: float | None
    run_stop_ms: float | None
    compliant: bool
    """Passed the official compliance checker and parsed cleanly."""

    @property
    def minutes(self) -> float | None:
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return time_to_train_min(self.run_start_ms, self.run_stop_ms)

    @property
    def counts(self) -> bool:
        """Scored: compliant and timed with a possible time. Any other run is a dropped run."""
        minutes = self.minutes
        return self.compliant and minutes is not None and impossible_minutes(minutes) is None


@dataclass(frozen=True)
class WeakScore:
    num_models: int
    """M: compliant models trained."""
    total_min: float
    """Minutes from the earliest run_start to the latest run_stop of those models."""
    models_per_min: float


def time_to_train_min(run_start_ms: float, run_stop_ms: float) -> float:
    """One run's time to train in minutes (the summarizer's arithmetic, bit for bit)."""
    return (run_stop_ms - run_start_ms) / 60 / 1000


def olympic_mean(
    values: Sequence[float], *, dropped: int = 0, max_dropped: int = MAX_DROPPED_RUNS
) -> float | None:
    """Mean without the `max_dropped` fastest and slowest values; None if nothing is left.

    `dropped` runs were already removed before the call (non-compliant ones): each takes the
    place of one slowest value. More than `max_dropped` of them means no score.
    """
    if dropped > max_dropped:
        return None
    ordered = sorted(values)
    kept = ordered[max_dropped : len(ordered) - (max_dropped - dropped)]
    if not kept:
        return None
    return sum(kept) * 1.0 / len(kept)


def strong_score(runs: Sequence[RunTiming], *, max_dropped: int = MAX_DROPPED_RUNS) -> float | None:
    """Raw strong-scaling score in minutes: olympic mean over the runs that count."""
    minutes = [r.minutes for r in runs if r.counts]
    dropped = len(runs) - len(minutes)
    return olympic_mean([m for m in minutes if m is not None], dropped=dropped, max_dropped=max_dropped)


def olympic_drops(runs: Sequence[RunTiming], *, max_dropped: int = MAX_DROPPED_RUNS) -> list[str | None]:
    """Per run, why olympic scoring leaves it out ("fastest", "slowest", "not counted"), or None.

    Runs that do not count (non-compliant or untimed) take the slowest places first, as in
    `olympic_mean`; ties go to the earlier file.
    """
    roles: list[str | None] = [None if r.counts else "not counted" for r in runs]
    counted = sorted((r.minutes or 0.0, i) for i, r in enumerate(runs) if r.counts)
    dropped = len(runs) - len(counted)
    for _, i in counted[:max_dropped]:
        roles[i] = "fastest"
    slowest = max(0, max_dropped - dropped)
    for _, i in counted[len(counted) - slowest :] if slowest else []:
        roles[i] = roles[i] or "slowest"
    return roles


def apply_scaling_factor(raw_min: float | None, factor: float = 1.0) -> float | None:
    """The reported score: raw score × RCP scaling factor (≥ 1 when the RCP check sets one)."""
    return None if raw_min is None else raw_min * factor


def models_per_minute(num_models: int, total_min: float) -> float | None:
    """Weak-scaling throughput; None when the time is not positive."""
    return num_models / total_min if total_min > 0 else None


def weak_score(runs: Sequence[RunTiming], required_models: int) -> WeakScore | None:
    """Weak-scaling score over the runs that count; None with fewer than `required_models`."""
    counted = [r for r in runs if r.counts]
    if not counted or len(counted) < required_models:
        return None
    start = min(r.run_start_ms for r in counted if r.run_start_ms is not None)
    stop = max(r.run_stop_ms for r in counted if r.run_stop_ms is not None)
    total = time_to_train_min(start, stop)
    per_min = models_per_minute(len(counted), total)
    if per_min is None:
        return None
    return WeakScore(num_models=len(counted), total_min=total, models_per_min=per_min)


@dataclass(frozen=True)
class FixedEpochScore:
    """HPC AI500's score of one fixed-epoch run: FLOPS over run_start..run_stop and Valid FLOPS."""

    quality: float
    """The last evaluation's value (the quality the run reached)."""
    flops: float
    valid_flops: float


def log_fixed_epoch_score(log: RunLog, minutes: float | None = None) -> FixedEpochScore | None:
    """`fixed_epoch_score` of a parsed fixed-epoch log (None for a target-mode run); `minutes`
    defaults to the log's run_start..run_stop."""
    if log.loop_mode != "fixed_epochs":
        return None
    if minutes is None and log.has_start_stop:
        minutes = (log.run_stop_ms - log.run_start_ms) / 60_000  # type: ignore[operator]
    return fixed_epoch_score(
        log.benchmark, log.evals, log.flops_per_sample, log.train_samples, log.vflops_exponent, minutes
    )


def fixed_epoch_score(
    benchmark: str | None,
    evals: Sequence[tuple[str, float, float]],
    flops_per_sample: float | None,
    train_samples: float | None,
    exponent: float | None,
    minutes: float | None,
) -> FixedEpochScore | None:
    """Score a fixed-epoch run from what its log holds; None when something to score it is missing."""
    target = hpc_ai500_target(benchmark)
    if target is None or not evals or None in (flops_per_sample, train_samples, exponent, minutes):
        return None
    assert flops_per_sample is not None and train_samples is not None and exponent is not None
    assert minutes is not None
    epochs = int(max(epoch for _, epoch, _ in evals))
    quality = evals[-1][2]
    flops = run_flops(flops_per_sample, train_samples, epochs, minutes * 60.0)
    if flops is None or exponent <= 0 or not (math.isfinite(quality) and quality >= 0):
        return None
    return FixedEpochScore(quality, flops, valid_flops_penalty(flops, quality, target, exponent))
