"""`mlhpc report`: where each run's time went (the breakdown files `mlhpc run` writes), printed
as a table and plotted as one stacked bar per run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import SubmissionError
from mlhpc.common.plots import pyplot, write_png
from mlhpc.common.timing import PHASES, Breakdown


@dataclass(frozen=True)
class RunBreakdown:
    name: str
    """The run's place under the report folder, e.g. mlhpc/<system>/strong/cosmoflow/result_0."""
    seed: int | None
    breakdown: Breakdown


def read_breakdowns(folder: Path) -> list[RunBreakdown]:
    """Every breakdown file under `folder` (a submission root, its breakdown/ folder, or one file)."""
    folder = Path(folder)
    if not folder.exists():
        raise SubmissionError(f"{folder} does not exist; pass the --out folder of an `mlhpc run`")
    paths = [folder] if folder.is_file() else sorted(folder.rglob("result_*.json"), key=_natural)
    runs = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            breakdown = Breakdown.from_dict(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SubmissionError(
                f"{path} is not an mlhpc time breakdown ({type(error).__name__}: {error}); "
                "remove it or rerun the run that wrote it"
            ) from None
        name = path.relative_to(folder).with_suffix("").as_posix() if path != folder else path.stem
        runs.append(
            RunBreakdown(name=name.removeprefix("breakdown/"), seed=data.get("seed"), breakdown=breakdown)
        )
    if not runs:
        raise SubmissionError(
            f"{folder} holds no breakdown/…/result_*.json; `mlhpc run` writes them beside the submission"
        )
    return runs


def report_command(folder: Path, *, plot: Path | None = None) -> list[RunBreakdown]:
    from rich.console import Console
    from rich.table import Table

    runs = read_breakdowns(folder)
    console = Console(width=max(100, 30 + 17 * len(runs)))
    entries = sorted({run.name.rsplit("/", 1)[0] for run in runs})
    table = Table(title=f"where the time went: {', '.join(entries)}")
    table.add_column("phase")
    for run in runs:
        label = run.name if len(entries) > 1 else run.name.rsplit("/", 1)[-1]
        table.add_column(f"{label}\nseed {run.seed}", justify="right")
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
    console.print(table)
    if plot is not None:
        plot_breakdowns(runs, plot)
        console.print(f"wrote {plot}")
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


def _seconds_share(breakdown: Breakdown, phase: str) -> str:
    return f"{breakdown.seconds[phase]:.2f} s {breakdown.shares()[phase]:4.0%}"


def _natural(path: Path) -> tuple[str, int]:
    index = path.stem.rsplit("_", 1)[-1]
    return (path.parent.as_posix(), int(index) if index.isdigit() else -1)
