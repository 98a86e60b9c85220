"""`mlhpc report`: where each run's time went (the breakdown files `mlhpc run` writes), printed
as a table per campaign entry that fits the terminal, written whole as JSON or CSV, and plotted as
one stacked bar per run."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import shutil
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.display.plots import pyplot, write_png
from mlhpc.common.display.waiting import say_if_slow
from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import result_of_breakdown
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.safeio.safe_read import RefusedFile, find_files, read_bytes
from mlhpc.common.safeio.writable import PNG_KIND, csv_kind, json_kind, refuse_output_over_inputs
from mlhpc.common.training.timing import PHASES, Breakdown

MAX_BREAKDOWN_BYTES = 2**20
"""A breakdown file is about 1 kB; anything this big is not one."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunBreakdown:
    name: str
    """The run's place under the report folder, e.g. mlhpc/<system>/strong/cosmoflow/result_0."""
    seed: int | None
    breakdown: Breakdown
    valid_flops: float | None = None
    """HPC AI500's Valid FLOPS of a fixed-epoch run, from its result log beside the breakdown
    (`scoring.fixed_epoch_score`: FLOPS over run_start..run_stop × (mAP / target)^n); None for a
    target-mode run or when the log is not there."""

    @property
    def run_flops_per_s(self) -> float:
        """HPC AI500's FLOPS: training FLOPs over the run's time (run_start..run_stop, data loading,
        evaluation and communication included), where `achieved_flops_per_s` divides by the
        forward + backward seconds only."""
        b = self.breakdown
        return b.flops_per_sample * b.train_samples_seen / b.time_to_train_s if b.time_to_train_s > 0 else 0.0


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
        valid_flops=_fixed_epoch_valid_flops(path),
    )


def _fixed_epoch_valid_flops(breakdown_path: Path) -> float | None:
    """Valid FLOPS of a fixed-epoch run from its result log; None for any other run or no log."""
    from mlhpc.submission_checker.logparse import parse_log
    from mlhpc.submission_checker.scoring import log_fixed_epoch_score

    log_path = result_of_breakdown(breakdown_path)
    if log_path is None or not log_path.is_file():
        return None
    try:
        log = parse_log(log_path)
    except OSError as e:  # unreadable or refused: the breakdown still reports, without the score
        _log.warning("no Valid FLOPS for %s: %s", shown(str(log_path)), e)
        return None
    score = log_fixed_epoch_score(log)
    return None if score is None else score.valid_flops


def _print_campaign(console: Any, entry: str, mine: list[RunBreakdown], *, files_asked: bool) -> None:
    """One campaign entry's table, how its runs ran, and what the terminal's width left out."""
    from rich.markup import escape

    table, left_out = campaign_table(entry, mine, console)
    console.print(table)
    for how, count in Counter(_settings(run.breakdown) for run in mine).items():
        if how:
            console.print(f"how it ran: {escape(how)} ({count} of {len(mine)} runs)")
    overlapped = [run.breakdown.overlapped_staging for run in mine if run.breakdown.overlapped_staging]
    if overlapped:
        console.print(escape(overlap_line(overlapped, len(mine))))
    if left_out:
        more = "" if files_asked else " and --json/--csv"
        console.print(f"left out for the terminal's width: {', '.join(left_out)} (see a wider terminal{more})")
    console.print()


def report_command(
    folder: Path,
    *,
    plot: Path | None = None,
    json_path: Path | None = None,
    csv_path: Path | None = None,
) -> list[RunBreakdown]:
    """`mlhpc report`: a table per campaign entry, no wider than the terminal (the smallest phases
    left out first when it is narrow, and said so); every figure in `json_path` / `csv_path`."""
    from rich.console import Console
    from rich.markup import escape

    # Outputs judged before reading: none may be, or lie in, the folder the report reads.
    outputs = {
        option: refuse_output_over_inputs(path, [folder], option, kind=kind)
        for option, path, kind in (
            ("--plot", plot, PNG_KIND),
            ("--json", json_path, JSON_KIND),
            ("--csv", csv_path, CSV_KIND),
        )
        if path is not None
    }
    with say_if_slow(f"reading the time breakdowns under {shown(folder)}"):
        runs = read_breakdowns(folder)
    console = Console(width=shutil.get_terminal_size().columns, highlight=False)
    for entry, mine in campaigns(runs).items():
        _print_campaign(console, entry, mine, files_asked=bool(json_path or csv_path))
    if "--json" in outputs:
        atomic_write_json(
            outputs["--json"],
            {"format": JSON_FORMAT, "campaigns": [_entry_json(e, m) for e, m in campaigns(runs).items()]},
        )
        console.print(f"wrote {escape(shown(outputs['--json']))}")
    if "--csv" in outputs:
        atomic_write_text(outputs["--csv"], report_csv(runs))
        console.print(f"wrote {escape(shown(outputs['--csv']))}")
    if "--plot" in outputs:
        plot_breakdowns(runs, outputs["--plot"])
        console.print(f"wrote {escape(shown(outputs['--plot']))}")
    return runs


def campaigns(runs: list[RunBreakdown]) -> dict[str, list[RunBreakdown]]:
    """The runs grouped by the folder their breakdowns sit in: one campaign's entry each (a folder
    holding several campaigns' --out gives one group per campaign and benchmark)."""
    groups: dict[str, list[RunBreakdown]] = {}
    for run in runs:
        groups.setdefault(_entry(run), []).append(run)
    return groups


def _entry(run: RunBreakdown) -> str:
    return run.name.rsplit("/", 1)[0] if "/" in run.name else "."


def campaign_table(entry: str, runs: list[RunBreakdown], console: Any) -> tuple[Any, list[str]]:
    """One row per run: total seconds, each phase's share, what is unaccounted, GFLOP/s. Phases
    with the smallest share over the campaign are left out (and named) until the table fits."""
    from rich import box
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    totals = {phase: sum(r.breakdown.seconds[phase] for r in runs) for phase in PHASES}
    by_size = sorted(PHASES, key=lambda phase: totals[phase])
    left_out: list[str] = []
    while True:
        table = Table(
            title=f"where the time went: {escape(shown(entry))} ({len(runs)} runs)",
            box=box.SIMPLE_HEAD,
            title_justify="left",
        )
        table.add_column("run")
        table.add_column("total s", justify="right")
        kept = [phase for phase in PHASES if phase not in left_out]
        for phase in kept:
            table.add_column(phase, justify="right")
        table.add_column("unaccounted", justify="right")
        table.add_column("GFLOP/s", justify="right")
        table.add_column("run GFLOP/s", justify="right")  # over run_start..run_stop (HPC AI500)
        scored = any(r.valid_flops is not None for r in runs)
        if scored:
            table.add_column("Valid GFLOPS", justify="right")
        for run in runs:
            shares, b = run.breakdown.shares(), run.breakdown
            table.add_row(
                escape(shown(f"{run.name.rsplit('/', 1)[-1].removeprefix('result_')} (seed {run.seed})")),
                f"{b.total_s:.2f}",
                *(f"{shares[phase]:.0%}" for phase in kept),
                f"{(b.total_s - b.accounted_s) / (b.total_s or 1):.0%}",
                f"{b.achieved_flops_per_s / 1e9:.1f}",
                f"{run.run_flops_per_s / 1e9:.1f}",
                *([_gflops(run.valid_flops)] if scored else []),
            )
        width = Measurement.get(console, console.options.update_width(10_000), table).maximum
        if width <= console.width or len(left_out) == len(PHASES):
            return table, sorted(left_out, key=PHASES.index)
        left_out.append(by_size[len(left_out)])


def _gflops(value: float | None) -> str:
    return "" if value is None else f"{value / 1e9:.3g}"


def overlap_line(figures: list[dict[str, float]], runs: int) -> str:
    """How the staging overlapped training (--staging overlap), as medians over the runs."""

    def median(key: str) -> float:
        return statistics.median(f.get(key, 0.0) for f in figures)

    return (
        f"staging overlapped training ({len(figures)} of {runs} runs, medians): {median('overlapped_s'):.1f} s "
        f"of {median('staging_s'):.1f} s beside training, {median('waited_s'):.1f} s waited for at the end, "
        f"{median('files_read_for_training'):.0f} files read from the source for training (their wait is "
        "in data_wait)"
    )


def _entry_json(entry: str, runs: list[RunBreakdown]) -> dict[str, Any]:
    return {
        "entry": entry,
        "runs": [
            {
                "run": run.name,
                "seed": run.seed,
                **run.breakdown.to_dict(),
                "run_flops_per_s": run.run_flops_per_s,
                "valid_flops": run.valid_flops,
            }
            for run in runs
        ],
    }


CSV_FIELDS = (
    "entry",
    "run",
    "seed",
    "total_s",
    "time_to_train_s",
    "init_s",
    *(f"phase_{phase}_s" for phase in PHASES),
    "unaccounted_s",
    "flops_per_sample",
    "achieved_flops_per_s",
    "run_flops_per_s",
    "valid_flops",
    "train_samples_seen",
    "settings",
)
JSON_FORMAT = "mlhpc report"
"""The first key of `--json`: an existing file is replaced only when it carries it."""
JSON_KIND = json_kind(JSON_FORMAT)
CSV_KIND = csv_kind(",".join(CSV_FIELDS), "a `mlhpc report --csv` table")


def report_csv(runs: list[RunBreakdown]) -> str:
    """One row per run with every figure the table shows in part."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for run in runs:
        b = run.breakdown
        writer.writerow(
            {
                "entry": _entry(run),
                "run": run.name,
                "seed": run.seed,
                "total_s": b.total_s,
                "time_to_train_s": b.time_to_train_s,
                "init_s": b.init_s,
                **{f"phase_{phase}_s": b.seconds[phase] for phase in PHASES},
                "unaccounted_s": b.total_s - b.accounted_s,
                "flops_per_sample": b.flops_per_sample,
                "achieved_flops_per_s": b.achieved_flops_per_s,
                "run_flops_per_s": run.run_flops_per_s,
                "valid_flops": run.valid_flops,
                "train_samples_seen": b.train_samples_seen,
                "settings": _settings(b),
            }
        )
    return out.getvalue()


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


def _natural(path: Path) -> tuple[str, int]:
    index = path.stem.rsplit("_", 1)[-1]
    return (path.parent.as_posix(), int(index) if index.isdigit() else -1)
