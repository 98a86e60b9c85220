"""Run-to-run variability of time-to-train: how much seeds differ, and how many runs a fair
comparison of two systems needs when each is scored by the olympic mean (MLPerf HPC's rule).

Pure statistics first; reading logs and printing/plotting after.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlhpc.common.display.plots import pyplot, write_png
from mlhpc.common.display.waiting import say_if_slow
from mlhpc.common.errors import SubmissionError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.safe_read import find_files, refusal
from mlhpc.common.safeio.writable import PNG_KIND, refuse_output_over_inputs
from mlhpc.submission_checker import scoring

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from mlhpc.submission_checker.logparse import RunLog

MAX_RUNS = 200
"""The largest campaign `runs_needed` considers."""
MAX_MINUTES = 10 * 365 * 24 * 60
"""A run said to take longer than ten years has broken timestamps; it is left out."""
MAX_EPOCHS = 10**6
"""Nor does a run reach its target after a million epochs (and sums of 1e308 overflow)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RunPoint:
    """One successful run: what its log says."""

    path: str
    seed: int | None
    epochs: float
    """Epoch of the last evaluation before run_stop: the one that reached the target."""
    minutes: float
    """(run_stop - run_start) / 60000, as the MLPerf scorers time it."""
    valid_flops: float | None = None
    """A fixed-epoch run (loop_mode fixed_epochs): HPC AI500's Valid FLOPS, FLOPS over
    run_start..run_stop × (quality / target)^n (`scoring.fixed_epoch_score`); None in target mode."""


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Mean, sample standard deviation and coefficient of variation of a set of values."""

    values: tuple[float, ...]
    mean: float
    std: float
    cv: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(values=tuple(values), mean=mean, std=std, cv=std / mean if mean else 0.0)


def olympic_mean(values: Sequence[float]) -> float:
    """The checker's olympic mean (fastest and slowest run dropped), refusing fewer than 3 runs."""
    mean = scoring.olympic_mean(values) if len(values) >= 3 else None
    if mean is None:
        raise ValueError(f"an olympic mean needs at least 3 runs, got {len(values)}")
    return mean


DRAWS = 40_000
"""Simulated campaigns behind `olympic_se_factor`: about 0.5 % precision."""


@cache
def _olympic_se_table(max_runs: int = MAX_RUNS, draws: int = DRAWS) -> tuple[float, ...]:
    """`olympic_se_factor` for 3..max_runs runs from one fixed-seed simulation: each campaign of
    n runs is the first n columns of the same draws (sum minus running min and max), so the
    whole table costs what one sort did (0.2 s, not 25 s for a scan to 200), and with the
    draws shared the factor falls with n without the simulation's noise reordering it."""
    rng = np.random.default_rng(20260)
    counts = np.arange(3, max_runs + 1)
    total, squares = np.zeros(len(counts)), np.zeros(len(counts))
    for start in range(0, draws, 5000):
        x = rng.standard_normal((min(5000, draws - start), max_runs))
        kept = np.cumsum(x, axis=1) - np.minimum.accumulate(x, axis=1) - np.maximum.accumulate(x, axis=1)
        means = kept[:, 2:] / (counts - 2)
        total += means.sum(axis=0)
        squares += (means * means).sum(axis=0)
    variance = (squares - total * total / draws) / (draws - 1)
    return tuple(float(v) for v in np.sqrt(variance))


def olympic_se_factor(runs: int, draws: int = DRAWS) -> float:
    """Standard deviation of the olympic mean of `runs` independent standard normal draws.

    No closed form exists for n > 3 (for n = 3 it is the median's, sqrt(0.4487)); a fixed-seed
    simulation gives it to about 0.5 %.
    """
    if runs < 3:
        raise ValueError(f"an olympic mean needs at least 3 runs, got {runs}")
    return _olympic_se_table(max(runs, MAX_RUNS), draws)[runs - 3]


def runs_needed(cv: float, difference: float, confidence: float = 0.95) -> int | None:
    """Fewest runs per system whose olympic means tell apart two systems `difference` apart
    (relative, e.g. 0.05 for 5 %), when each run's time varies with coefficient `cv`.

    Two-sided test on the difference of two olympic means: distinguishable when
    difference >= z * sqrt(2) * cv * olympic_se_factor(n). None if even MAX_RUNS runs are not enough.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be between 0 and 1")
    if difference <= 0:
        raise ValueError(f"difference {difference} must be positive")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    for runs in range(3, MAX_RUNS + 1):
        if difference >= z * math.sqrt(2) * cv * olympic_se_factor(runs):
            return runs
    return None


def read_runs(folder: Path) -> dict[Path, list[RunPoint]]:
    """The successful runs under `folder`, grouped by the folder holding their result_*.txt.

    A file that cannot be read safely (not a regular file, too big, a link loop or out of
    `folder`) is skipped with a warning, and so is a run whose timestamps go backwards.
    """
    from mlhpc.submission_checker.compliance import MAX_RESULT_BYTES

    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        raise SubmissionError(f"{folder} does not exist; pass a campaign's or a submission's folder")
    if folder.is_dir():
        paths, refused = find_files(folder, "result_*.txt", MAX_RESULT_BYTES, what="a result log")
        for path, problem in refused:
            _log.warning("skipped %s", problem.line(path))
    else:  # one file named on its own: refused is the error
        problem = refusal(folder, MAX_RESULT_BYTES, what="a result log")
        if problem is not None:
            raise SubmissionError(problem.line(folder))
        paths = [folder]
    groups: dict[Path, list[RunPoint]] = {}
    for path in paths:
        point = _read_point(path)
        if point is not None:
            groups.setdefault(path.parent, []).append(point)
    if not groups:
        raise SubmissionError(
            f"{folder} holds no successful result_*.txt log; pass a folder with a campaign's results"
        )
    return groups


def _read_point(path: Path) -> RunPoint | None:
    """One log's run, or None (with a warning when something is wrong with the file)."""
    from mlhpc.submission_checker.logparse import parse_log

    try:
        log = parse_log(path)
    except OSError as e:
        _log.warning("skipped %s: cannot read it: %s; make it a readable file", path, e.strerror or e)
        return None
    if log.impossible:  # the parser drops a time it cannot believe: say so, not a silent skip
        line, why = log.impossible[0]
        _log.warning(
            "left out %s: line %s: %s, not a plausible number; fix the log or rerun that seed",
            path,
            line,
            why,
        )
        return None
    if log.run_stop_status != "success" or not log.has_start_stop or not log.evals:
        return None
    seed = int(log.seeds[0][0]) if log.seeds and log.seeds[0][0].lstrip("-").isdigit() else None
    minutes = (log.run_stop_ms - log.run_start_ms) / 60_000  # type: ignore[operator]
    epochs = log.evals[-1][1]
    if minutes < 0:
        _log.warning(
            "left out %s: its timestamps go backwards (run_stop on line %s is %.3f min before run_start "
            "on line %s); fix the log's clock or rerun that seed",
            path, log.run_stop_line, -minutes, log.run_start_line,
        )  # fmt: skip
        return None
    if not (minutes <= MAX_MINUTES and 0 <= epochs <= MAX_EPOCHS):  # NaN fails every comparison
        _log.warning(
            "left out %s: run_start/run_stop time_ms or the last epoch_num is not a plausible number "
            "(%s min, epoch %s); fix the log or rerun that seed",
            path, minutes, epochs,
        )  # fmt: skip
        return None
    return RunPoint(path=str(path), seed=seed, epochs=epochs, minutes=minutes, valid_flops=_valid_flops(log))


def _valid_flops(log: RunLog) -> float | None:
    """A fixed-epoch run's Valid FLOPS (scored with the penalty, not dropped below the target)."""
    from mlhpc.submission_checker.scoring import log_fixed_epoch_score

    score = log_fixed_epoch_score(log)
    return None if score is None else score.valid_flops


@dataclass(frozen=True, kw_only=True)
class Variability:
    """One entry's variability, ready to print or serialise."""

    entry: str
    runs: tuple[RunPoint, ...]
    epochs: Spread
    minutes: Spread
    olympic_minutes: float | None
    runs_needed: int | None
    difference: float
    confidence: float
    valid_flops: Spread | None = None
    """Over the fixed-epoch runs that have one: HPC AI500's Valid FLOPS spread."""


def analyse(entry: str, runs: Sequence[RunPoint], difference: float, confidence: float) -> Variability:
    minutes = Spread.of([r.minutes for r in runs])
    scored = [r.valid_flops for r in runs if r.valid_flops is not None]
    return Variability(
        entry=entry,
        runs=tuple(runs),
        epochs=Spread.of([r.epochs for r in runs]),
        minutes=minutes,
        olympic_minutes=olympic_mean(minutes.values) if len(runs) >= 3 else None,
        runs_needed=runs_needed(minutes.cv, difference, confidence),
        difference=difference,
        confidence=confidence,
        valid_flops=Spread.of(scored) if scored else None,
    )


def variability_command(
    folder: Path, *, difference: float = 0.05, confidence: float = 0.95, plot: Path | None = None
) -> list[Variability]:
    """`mlhpc variability DIR`: print each entry's table and write the distributions' PNG."""
    from rich.console import Console
    from rich.markup import escape

    if plot is not None:  # before the reading: a plot over a log it reads is refused up front
        plot = refuse_output_over_inputs(plot, [folder], "--plot", kind=PNG_KIND)
    with say_if_slow(f"reading the result logs under {shown(folder)}"):
        groups = read_runs(folder)
    with say_if_slow(f"working out the run counts of {len(groups)} entries"):
        results = [
            analyse(_entry_name(path, Path(folder)), runs, difference, confidence)
            for path, runs in groups.items()
        ]
    console = Console(width=shutil.get_terminal_size().columns, highlight=False)
    for result in results:
        _print_entry(console, result)
    if plot is not None:
        plot_distributions(results, plot)
        console.print(f"wrote {escape(shown(plot))}")
    return results


def _print_entry(console: Console, result: Variability) -> None:
    """One entry: its runs' table, then the olympic mean, the Valid FLOPS and the runs needed."""
    from rich.markup import escape

    # Folder names are data, not markup: "[/x]" in one must not stop the table.
    console.print(f"[bold]{escape(shown(result.entry))}[/bold]: {len(result.runs)} successful runs")
    console.print(_runs_table(result))
    olympic = f"{result.olympic_minutes:.3f} min" if result.olympic_minutes is not None else "n/a (<3 runs)"
    if result.valid_flops is not None:
        v = result.valid_flops
        console.print(
            f"HPC AI500 Valid FLOPS over {len(v.values)} fixed-epoch runs: mean {v.mean / 1e9:.4g} "
            f"GFLOPS, cv {v.cv:.1%} (FLOPS over run_start..run_stop x (quality / target)^n)"
        )
    needed = str(result.runs_needed) if result.runs_needed is not None else f"more than {MAX_RUNS}"
    console.print(
        f"olympic mean {olympic}; to tell two systems {result.difference:.0%} apart at "
        f"{result.confidence:.0%} confidence, each needs {needed} runs (time-to-train cv "
        f"{result.minutes.cv:.1%})\n"
    )


def _runs_table(result: Variability) -> Table:
    """Each run's seed, epochs and minutes to target (and Valid GFLOPS), then mean, std and cv."""
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for column in ("run", "seed", "epochs to target", "minutes to target"):
        table.add_column(column, justify="right")
    if result.valid_flops is not None:
        table.add_column("Valid GFLOPS", justify="right")
    for run in result.runs:
        vflops = [] if result.valid_flops is None else [_gflops(run.valid_flops)]
        table.add_row(
            escape(shown(Path(run.path).stem)),
            str(run.seed),
            f"{run.epochs:g}",
            f"{run.minutes:.3f}",
            *vflops,
        )
    for label, spread in (("mean", "mean"), ("std", "std")):
        table.add_row(
            label, "", f"{getattr(result.epochs, spread):.3f}", f"{getattr(result.minutes, spread):.3f}"
        )
    table.add_row("cv", "", f"{result.epochs.cv:.1%}", f"{result.minutes.cv:.1%}")
    return table


def plot_distributions(results: Sequence[Variability], path: Path) -> None:
    """Minutes and epochs to target per entry, one dot per run, with the mean."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 0.6 * len(results) + 2.2), squeeze=False)
    rng = np.random.default_rng(0)
    for row, result in enumerate(results):
        for axis, spread in zip(axes[0], (result.minutes, result.epochs), strict=True):
            jitter = row + rng.uniform(-0.15, 0.15, len(spread.values))
            axis.scatter(spread.values, jitter, s=14, alpha=0.7)
            axis.plot([spread.mean, spread.mean], [row - 0.3, row + 0.3], color="black")
    for axis, label in zip(axes[0], ("minutes to target", "epochs to target"), strict=True):
        axis.set_yticks(range(len(results)), [r.entry for r in results], fontsize=7)
        axis.set_xlabel(label)
        axis.grid(axis="x", alpha=0.3)
    write_png(fig, path)


def _gflops(value: float | None) -> str:
    return "" if value is None else f"{value / 1e9:.4g}"


def _entry_name(entry: Path, root: Path) -> str:
    try:
        return entry.relative_to(root).as_posix() or entry.name
    except ValueError:
        return entry.as_posix()
