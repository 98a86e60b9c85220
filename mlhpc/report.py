"""`mlhpc report`: where each run's time went (the breakdown files `mlhpc run` writes), printed
as a table and plotted as one stacked bar per run."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import SubmissionError
from mlhpc.common.plots import pyplot, write_png
from mlhpc.common.safe_read import RefusedFile, find_files, read_bytes
from mlhpc.common.timing import PHASES, Breakdown

MAX_BREAKDOWN_BYTES = 2**20
"""A breakdown file is about 1 kB; anything this big is not one."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunBreakdown:
    name: str
    """The run's place under the report folder, e.g. mlhpc/<system>/strong/cosmoflow/result_0."""
    seed: int | None
    breakdown: Breakdown


def read_breakdowns(folder: Path) -> list[RunBreakdown]:
    """Every breakdown file under `folder` (a submission root, its breakdown/ folder, or one file).

    Under a folder, a file that cannot be read safely or is not a breakdown is skipped with a
    warning; one file named on its own is read or refused with a SubmissionError.
    """
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        raise SubmissionError(f"{folder} does not exist; pass the --out folder of an `mlhpc run`")
    if not folder.is_dir():
        return [_read_one(folder, folder)]
    paths, refused = find_files(folder, "result_*.json", MAX_BREAKDOWN_BYTES, what="a time breakdown")
    skipped = [problem.line(path) for path, problem in refused]
    runs = []
    for path in sorted(paths, key=_natural):
        try:
            runs.append(_read_one(path, folder))
        except SubmissionError as e:
            skipped.append(str(e))
    if not runs and skipped:  # nothing to report: the reason is the error
        more = f" (and {len(skipped) - 1} more unreadable)" if len(skipped) > 1 else ""
        raise SubmissionError(skipped[0] + more)
    if not runs:
        raise SubmissionError(
            f"{folder} holds no breakdown/…/result_*.json; `mlhpc run` writes them beside the submission"
        )
    for line in skipped:
        _log.warning("skipped %s", line)
    return runs


def _read_one(path: Path, folder: Path) -> RunBreakdown:
    """One breakdown file, or a SubmissionError naming it and the fix."""
    fix = "remove it or rerun the run that wrote it"
    try:
        data = json.loads(read_bytes(path, MAX_BREAKDOWN_BYTES, what="a time breakdown").decode("utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        breakdown = Breakdown.from_dict(data)
    except RefusedFile as e:
        raise SubmissionError(e.refusal.line(path)) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as error:
        why = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        raise SubmissionError(f"{path} is not an mlhpc time breakdown ({why}); {fix}") from None
    times = [breakdown.time_to_train_s, breakdown.init_s, *breakdown.seconds.values()]
    numbers = [*times, breakdown.flops_per_sample, breakdown.achieved_flops_per_s]
    if not all(math.isfinite(x) for x in numbers):
        raise SubmissionError(f"{path} holds a time or FLOP count that is not a finite number; {fix}")
    if min(times) < 0:
        raise SubmissionError(f"{path} holds a negative time: its clock went backwards; {fix}")
    name = path.relative_to(folder).with_suffix("").as_posix() if path != folder else path.stem
    seed = data.get("seed")
    return RunBreakdown(
        name=name.removeprefix("breakdown/"),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        breakdown=breakdown,
    )


def report_command(folder: Path, *, plot: Path | None = None) -> list[RunBreakdown]:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    runs = read_breakdowns(folder)
    console = Console(width=max(100, 30 + 17 * len(runs)))
    entries = sorted({run.name.rsplit("/", 1)[0] for run in runs})
    # Run names come from file names: data, not markup.
    table = Table(title=f"where the time went: {escape(', '.join(entries))}")
    table.add_column("phase")
    for run in runs:
        label = run.name if len(entries) > 1 else run.name.rsplit("/", 1)[-1]
        table.add_column(f"{escape(label)}\nseed {run.seed}", justify="right")
    for phase in PHASES:
        table.add_row(phase, *(_seconds_share(r.breakdown, phase) for r in runs))
    table.add_row("total (init + time-to-train)", *(f"{r.breakdown.total_s:.2f} s" for r in runs))
    table.add_row(
        "unaccounted",
        *(
            f"{(r.breakdown.total_s - r.breakdown.accounted_s) / (r.breakdown.total_s or 1):.1%}"
            for r in runs
        ),
    )
    table.add_row("GFLOP per sample (fwd+bwd)", *(f"{r.breakdown.flops_per_sample / 1e9:.4f}" for r in runs))
    table.add_row("achieved GFLOP/s", *(f"{r.breakdown.achieved_flops_per_s / 1e9:.1f}" for r in runs))
    table.add_row("how it ran", *(escape(_settings(r.breakdown)) for r in runs))
    console.print(table)
    if plot is not None:
        plot_breakdowns(runs, plot)
        console.print(f"wrote {escape(str(plot))}")
    return runs


def plot_breakdowns(runs: list[RunBreakdown], path: Path) -> None:
    """One horizontal stacked bar per run: seconds per phase."""
    plt = pyplot()

    fig, axis = plt.subplots(figsize=(10, 0.35 * len(runs) + 1.8))
    left = [0.0] * len(runs)
    for phase in PHASES:
        widths = [run.breakdown.seconds[phase] for run in runs]
        axis.barh(range(len(runs)), widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axis.set_yticks(range(len(runs)), [run.name for run in runs], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("seconds (init + time-to-train)")
    axis.legend(ncol=5, fontsize=7, loc="lower right")
    write_png(fig, path)


def _settings(breakdown: Breakdown) -> str:
    """device, precision, compiled, memory format, loader; '' for a breakdown from before they were kept."""
    settings = breakdown.settings
    if not settings:
        return ""
    compiled = "compiled" if settings.get("compile") else "eager"
    return " ".join(
        str(part)
        for part in (
            settings.get("device"),
            settings.get("precision"),
            compiled,
            settings.get("memory_format"),
            settings.get("loader"),
        )
        if part is not None
    )


def _seconds_share(breakdown: Breakdown, phase: str) -> str:
    return f"{breakdown.seconds[phase]:.2f} s {breakdown.shares()[phase]:4.0%}"


def _natural(path: Path) -> tuple[str, int]:
    index = path.stem.rsplit("_", 1)[-1]
    return (path.parent.as_posix(), int(index) if index.isdigit() else -1)
