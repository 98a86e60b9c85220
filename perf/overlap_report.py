#!/usr/bin/env python3
"""perf/overlap_vcluster.py's figures: one run's MLLOG file read into time-to-train, the staging
interval and its place, and epochs; the runs grouped by nodes and staging mode, the table and the
plot. Pure: no cluster here (tests/perf/test_overlap_vcluster.py reads hand-written logs).

    perf/overlap_report.py runs/overlap-vcluster/overlap_*.json [--png OUT.png] [--reference before] [--rate 55mbit]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from mlhpc.submission_checker.logparse import TOKEN, decode_mllog, parse_log


class ReportError(Exception):
    """One line for the user: which file or run is wrong, and what to do."""


@dataclass(frozen=True, kw_only=True)
class RunFigures:
    """One run of `mlhpc run` as its MLLOG file tells it (seconds), and where it ran."""

    nodes: int
    mode: str
    """The `--staging` value it ran with (inside, before, overlap, ...)."""
    repeat: int
    status: str | None
    """run_stop's status: only "success" runs count in the table."""
    ttt_s: float
    """Time-to-train: run_stop - run_start."""
    staging_s: float | None
    """staging_stop - staging_start; None when the log has no such pair."""
    staging_from_run_start_s: float | None
    """staging_start - run_start: negative when staging began before run_start."""
    staging_scored_s: float | None
    """The part of the staging interval inside run_start..run_stop (the part the score pays)."""
    epochs: int | None
    """epoch_num of the last evaluation before run_stop: epochs to target."""
    seed: int | None = None
    log: str = ""
    wall_s: float | None = None
    """The launch's whole wall time (srun, imports, init, checks), when the caller measured it."""

    @property
    def staging_share(self) -> float | None:
        """Staging's length as a share of time-to-train (for `before`: of a run that excludes it)."""
        return None if self.staging_s is None else self.staging_s / self.ttt_s

    @property
    def scored_share(self) -> float | None:
        """The scored part of staging as a share of time-to-train."""
        return None if self.staging_scored_s is None else self.staging_scored_s / self.ttt_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "staging_share": self.staging_share, "scored_share": self.scored_share}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RunFigures:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


def _staging_start_ms(path: Path) -> float | None:
    """time_ms of the first staging_start: RunLog keeps the interval's length, not its place."""
    with path.open(encoding="latin-1") as f:
        for text in f:
            if TOKEN not in text or '"staging_start"' not in text:
                continue
            try:
                record = decode_mllog(text)
            except ValueError:
                continue
            if record["key"] == "staging_start":
                return record["time_ms"]
    return None


def read_run(path: Path, *, nodes: int, mode: str, repeat: int, wall_s: float | None = None) -> RunFigures:
    """The figures of the run whose MLLOG result file is `path` (the checker's own parser)."""
    try:
        log = parse_log(path)
    except OSError as e:
        raise ReportError(f"{path}: cannot read it: {e}") from e
    if log.run_start_ms is None or log.run_stop_ms is None:
        raise ReportError(
            f"{path}: no run_start or run_stop: the run did not finish; see its output beside it"
        )
    start, stop = log.run_start_ms, log.run_stop_ms
    staging_s = from_start_s = scored_s = None
    begin = _staging_start_ms(path)
    if log.staging_ms is not None and begin is not None:
        end = begin + log.staging_ms
        staging_s = log.staging_ms / 1e3
        from_start_s = (begin - start) / 1e3
        scored_s = max(0.0, min(end, stop) - max(begin, start)) / 1e3
    epochs = max((int(epoch) for _, epoch, _ in log.evals), default=None)
    seed = json.loads(log.seeds[0][0]) if log.seeds else None
    return RunFigures(
        nodes=nodes, mode=mode, repeat=repeat, status=log.run_stop_status, ttt_s=(stop - start) / 1e3,
        staging_s=staging_s, staging_from_run_start_s=from_start_s, staging_scored_s=scored_s,
        epochs=epochs, seed=seed if isinstance(seed, int) else None, log=str(path), wall_s=wall_s,
    )  # fmt: skip


# --- grouping -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Cell:
    """The successful runs of one node count and one staging mode."""

    nodes: int
    mode: str
    runs: int
    failed: int
    ttt_median_s: float | None
    ttt_min_s: float | None
    ttt_max_s: float | None
    staging_median_s: float | None
    share_median: float | None
    scored_share_median: float | None
    epochs: tuple[int, ...]
    """Each successful run's epochs to target, sorted."""
    vs_reference: float | None = None
    """Median time-to-train over the reference mode's at the same node count."""


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def aggregate(runs: Sequence[RunFigures], reference: str = "before") -> list[Cell]:
    """One cell per (nodes, mode), nodes ascending, modes in the order they first ran; each
    with its ratio to `reference`'s median time-to-train at the same node count."""
    modes = list(dict.fromkeys(r.mode for r in runs))
    cells = []
    for nodes in sorted({r.nodes for r in runs}):
        for mode in modes:
            mine = [r for r in runs if r.nodes == nodes and r.mode == mode]
            if not mine:
                continue
            good = [r for r in mine if r.status == "success"]
            ttts = [r.ttt_s for r in good]
            cells.append(
                Cell(
                    nodes=nodes,
                    mode=mode,
                    runs=len(good),
                    failed=len(mine) - len(good),
                    ttt_median_s=_median(ttts),
                    ttt_min_s=min(ttts, default=None),
                    ttt_max_s=max(ttts, default=None),
                    staging_median_s=_median([r.staging_s for r in good]),
                    share_median=_median([r.staging_share for r in good]),
                    scored_share_median=_median([r.scored_share for r in good]),
                    epochs=tuple(sorted(r.epochs for r in good if r.epochs is not None)),
                )
            )
    return [_with_ratio(c, cells, reference) for c in cells]


def _with_ratio(cell: Cell, cells: list[Cell], reference: str) -> Cell:
    ref = next((c for c in cells if c.nodes == cell.nodes and c.mode == reference), None)
    if ref is None or not ref.ttt_median_s or cell.ttt_median_s is None:
        return cell
    return Cell(**{**asdict(cell), "vs_reference": cell.ttt_median_s / ref.ttt_median_s})


# --- table and plot -----------------------------------------------------------------------------


def _s(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _epochs(epochs: tuple[int, ...]) -> str:
    if not epochs:
        return "-"
    return str(epochs[0]) if len(set(epochs)) == 1 else f"{epochs[0]}-{epochs[-1]}"


def table(cells: Sequence[Cell], reference: str = "before") -> str:
    """A markdown table, nodes x mode: time-to-train median (min-max), staging, its shares,
    epochs, and the ratio to `reference`."""
    lines = [
        f"| nodes | mode | runs | time-to-train s, median (min-max) | staging s | staging share "
        f"| scored share | epochs | vs {reference} |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        runs = f"{c.runs}" + (f" (+{c.failed} failed)" if c.failed else "")
        spread = (
            "-" if c.ttt_median_s is None else f"{c.ttt_median_s:.1f} ({c.ttt_min_s:.1f}-{c.ttt_max_s:.1f})"
        )
        ratio = "-" if c.vs_reference is None else f"{c.vs_reference:.2f}"
        lines.append(
            f"| {c.nodes} | {c.mode} | {runs} | {spread} | {_s(c.staging_median_s)} | {_pct(c.share_median)} "
            f"| {_pct(c.scored_share_median)} | {_epochs(c.epochs)} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[RunFigures], png: Path, title: str = "") -> None:
    """Time-to-train by node count, one line per mode (median, bars min-max, each run a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = aggregate(runs)
    modes = list(dict.fromkeys(c.mode for c in cells))
    counts = sorted({c.nodes for c in cells})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, mode in enumerate(modes):
        shift = (i - (len(modes) - 1) / 2) * 0.08
        mine = [c for c in cells if c.mode == mode and c.ttt_median_s is not None]
        xs = [counts.index(c.nodes) + shift for c in mine]
        meds = [c.ttt_median_s for c in mine]
        low = [c.ttt_median_s - c.ttt_min_s for c in mine]  # type: ignore[operator]
        high = [c.ttt_max_s - c.ttt_median_s for c in mine]  # type: ignore[operator]
        line = ax.errorbar(xs, meds, yerr=[low, high], marker="o", capsize=3, label=mode)
        dots = [
            (counts.index(r.nodes) + shift, r.ttt_s) for r in runs if r.mode == mode and r.status == "success"
        ]
        ax.scatter([d[0] for d in dots], [d[1] for d in dots], s=9, alpha=0.4, color=line[0].get_color())
    ax.set_xticks(range(len(counts)), [str(n) for n in counts])
    ax.set_xlabel("nodes")
    ax.set_ylabel("time-to-train (s), run_start to run_stop")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "time-to-train by staging mode (median, min-max)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="--staging")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


# --- reading back -------------------------------------------------------------------------------


def load_runs(paths: Sequence[Path], rate: str | None = None) -> list[RunFigures]:
    """The runs of one or more JSON files that perf/overlap_vcluster.py wrote (those at the
    storage link `rate` alone, when given: a calibration holds several)."""
    runs = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            runs += [RunFigures.from_json(row) for row in data["runs"] if rate in (None, row.get("rate"))]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ReportError(f"{path}: not a results file of perf/overlap_vcluster.py ({e})") from e
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="perf/overlap_report.py", description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", type=Path, help="results files of perf/overlap_vcluster.py")
    p.add_argument("--png", type=Path, help="write the plot here")
    p.add_argument("--reference", default="before", help="the mode the ratios divide by (before)")
    p.add_argument("--rate", help="only the runs at this storage link rate (e.g. 55mbit)")
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.json, args.rate)
    except ReportError as e:
        print(f"overlap_report: {e}", file=sys.stderr)
        return 2
    print(table(aggregate(runs, args.reference), args.reference), end="")
    if args.png:
        plot(runs, args.png)
        print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
