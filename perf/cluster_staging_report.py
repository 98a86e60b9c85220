"""perf/cluster_staging.py's report: the CSV's medians beside the model, both crossovers, the
CPU table and the plot; `model` prints the model alone."""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_staging_cluster import StudyError, bits_per_s, file_sizes, load_setup
from cluster_staging_measure import dataset_sizes

from mlhpc.study.model import MODES, Setup, crossover, model_crossover, model_seconds

# --- the report ---------------------------------------------------------------------------------


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        raise StudyError(f"{path} not found: run perf/cluster_staging.py measure first")
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class _Point:
    median: float
    low: float
    high: float
    count: int


def _summarize(rows: list[dict]) -> dict[tuple[int, str], _Point]:
    groups: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        groups.setdefault((int(row["nodes"]), row["mode"]), []).append(float(row["stage_s"]))
    return {k: _Point(statistics.median(v), min(v), max(v), len(v)) for k, v in groups.items()}


@dataclass(frozen=True)
class Findings:
    table: str
    """Markdown: nodes x mode, the measured median (min-max) beside the model's seconds."""
    measured: float | None
    """The measured crossover copy/replicate (nodes)."""
    predicted: float | None
    """The model's, from the shaped rates alone."""
    predicted_gather: float | None
    """The model's, with the exchange's all-gather at its measured rate."""


def report(rows: list[dict], sizes: Sequence[int], setup: Setup) -> Findings:
    """The table and the crossovers; `setup` carries the measured all-gather rates, if any."""
    links = setup.at_link_rate()
    points = _summarize(rows)
    counts = sorted({n for n, m in points if m in MODES})
    lines = [
        "| nodes | copy | model | replicate | model | model, measured all-gather | shard | model |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in counts:
        cells = []
        for m in MODES:
            p = points.get((n, m))
            cells.append(f"{p.median:.1f} ({p.low:.1f}-{p.high:.1f})" if p else "-")
            cells.append(f"{model_seconds(m, n, sizes, links):.1f}")
            if m == "replicate":
                cells.append(f"{model_seconds(m, n, sizes, setup):.1f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    both = [n for n in counts if (n, "copy") in points and (n, "replicate") in points]
    largest = max(both, default=1)
    return Findings(
        "\n".join(lines),
        crossover(
            both, [points[n, "copy"].median for n in both], [points[n, "replicate"].median for n in both]
        ),
        model_crossover(sizes, links, largest),
        model_crossover(sizes, setup, largest),
    )


def _allgather_table(setup: Setup) -> str:
    lines = ["| nodes | all-gather, MB/s into each node | of the link's payload rate |", "|---:|---:|---:|"]
    for n, rate in setup.allgather_bytes_s:
        lines.append(f"| {n} | {rate / 1e6:.2f} | {rate / setup.link_bytes_s:.0%} |")
    return "\n".join(lines)


def _cpu_table(rows: list[dict]) -> str:
    """Per node count and mode (medians over the repeats), per second of staging: CPU the stage
    processes used (all nodes together) and the threads that waited for a CPU while runnable (on
    average), CPU of the file system's processes (sshfs, ssh, sshd), and the whole machine."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        if row["mode"] in MODES:
            groups.setdefault((int(row["nodes"]), row["mode"]), []).append(row)
    lines = [
        "| nodes | mode | stage CPU (cores) | threads waiting for a CPU | sshfs+sshd CPU (cores) "
        "| machine busy | CPU pressure |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (n, m), group in sorted(groups.items()):
        per_s = [_median(group, key, per_s=True) for key in ("stage_cpu_s", "stage_wait_s", "sshfs_cpu_s")]
        busy, pressure = _median(group, "host_busy"), _median(group, "host_cpu_pressure")
        lines.append(
            f"| {n} | {m} | " + " | ".join(f"{x:.2f}" for x in per_s) + f" | {busy:.0%} | {pressure:.0%} |"
        )
    return "\n".join(lines)


def _median(rows: list[dict], key: str, *, per_s: bool = False) -> float:
    return statistics.median(float(r[key]) / (float(r["stage_s"]) if per_s else 1.0) for r in rows)


def _plot(
    rows: list[dict],
    sizes: Sequence[int],
    setup: Setup,
    png: Path,
    found: Findings,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _summarize(rows)
    counts = sorted({n for n, m in points if m in MODES})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"copy": "tab:red", "replicate": "tab:blue", "shard": "tab:green"}
    labels = {
        "copy": "copy (every node reads)",
        "replicate": "replicate (read once, all-gather)",
        "shard": "shard",
    }
    grid = list(range(1, max(counts) + 1))
    links = setup.at_link_rate()
    for m in MODES:
        have = [n for n in counts if (n, m) in points]
        med = [points[n, m].median for n in have]
        err = [
            [points[n, m].median - points[n, m].low for n in have],
            [points[n, m].high - points[n, m].median for n in have],
        ]
        ax.errorbar(have, med, yerr=err, fmt="o", color=colors[m], capsize=3, label=f"{labels[m]}, measured")
        model = [model_seconds(m, n, sizes, links) for n in grid]
        ax.plot(grid, model, "--", color=colors[m], alpha=0.8, label=f"{m}: model (shaped rates)")
        if m == "replicate" and setup.allgather_bytes_s:
            gathered = [model_seconds(m, n, sizes, setup) for n in grid]
            ax.plot(grid, gathered, ":", color=colors[m], label=f"{m}: model, all-gather as measured")
    _decorate(ax, setup, sizes, grid, found)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def _decorate(ax: Any, setup: Setup, sizes: Sequence[int], grid: list[int], found: Findings) -> None:
    """The plot's crossover lines, axes, title and legend."""
    if found.measured:
        ax.axvline(found.measured, color="0.2", lw=1, label=f"crossover measured: {found.measured:.2f} nodes")
    if found.predicted:
        ax.axvline(
            found.predicted, color="0.5", lw=1, ls="--", label=f"crossover model: {found.predicted:.2f}"
        )
    ax.set_xlabel("nodes")
    ax.set_ylabel("staging time (s, rank 0's stage_dataset)")
    ax.set_xticks(grid)
    ax.set_ylim(bottom=0)
    total_mib = sum(sizes) / 2**20
    ax.set_title(
        f"{total_mib:.0f} MiB onto each node's /local: links {setup.link_bit_s / 1e6:.0f} Mbit/s, "
        f"shared FS {setup.fs_bit_s / 1e6:.0f} Mbit/s",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left")


def setup_from_rows(rows: list[dict]) -> Setup:
    """The setup the rows were measured with: the shaped rates, t0 (the median tiny staging on
    one node) and the all-gather's rate per node count (median over its repeats)."""
    tiny = [float(r["stage_s"]) for r in rows if r["mode"] == "tiny" and r["nodes"] == "1"]
    link = {r["link"] for r in rows if r["mode"] in MODES}
    fs = {r["fs"] for r in rows if r["mode"] in MODES}
    if len(link) != 1 or len(fs) != 1:
        raise StudyError(
            f"the CSV mixes link rates {sorted(link)} or file-system rates {sorted(fs)}: one setup a CSV"
        )
    gathers: dict[int, list[float]] = {}
    for r in rows:
        if r["mode"] == "allgather":
            gathers.setdefault(int(r["nodes"]), []).append(int(r["dataset_bytes"]) / float(r["stage_s"]))
    return Setup(
        link_bit_s=bits_per_s(link.pop()),
        fs_bit_s=bits_per_s(fs.pop()),
        overhead_s=statistics.median(tiny) if tiny else 0.0,
        allgather_bytes_s=tuple(sorted((n, statistics.median(v)) for n, v in gathers.items())),
    )


def cmd_report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rows = _read_rows(out / "cluster_staging.csv")
    setup = setup_from_rows(rows)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else dataset_sizes(load_setup(args.name))
    found = report(rows, sizes, setup)

    def nodes(x: float | None, compare: bool = True) -> str:
        if x is None:
            return "none"
        apart = abs(x - found.measured) / found.measured if found.measured and compare else None
        return f"{x:.2f} nodes" + (f" ({apart:.0%} from the measured)" if apart is not None else "")

    text = (
        f"{found.table}\n\nSeconds: rank 0's staging time, median (min-max) of the repeats; t0 (tiny dataset, "
        f"1 node) = {setup.overhead_s:.2f} s.\n\nCrossover copy/replicate: measured {nodes(found.measured, False)}; "
        f"model {nodes(found.predicted)}; model with the measured all-gather {nodes(found.predicted_gather)}.\n\n"
        f"{_allgather_table(setup)}\n\n{_cpu_table(rows)}\n"
    )
    (out / "cluster_staging.md").write_text(text)
    png = Path(args.png) if args.png else out / "cluster_staging.png"
    _plot(rows, sizes, setup, png, found)
    print(text)


def cmd_model(args: argparse.Namespace) -> None:
    setup = Setup(link_bit_s=bits_per_s(args.link), fs_bit_s=bits_per_s(args.fs), overhead_s=args.overhead_s)
    sizes = file_sizes(args.total_mib, args.file_mib)
    print("| nodes | " + " | ".join(MODES) + " |\n|---:|" + "---:|" * len(MODES))
    for n in [int(x) for x in args.nodes.split(",")]:
        print(f"| {n} | " + " | ".join(f"{model_seconds(m, n, sizes, setup):.1f}" for m in MODES) + " |")
    cross = model_crossover(sizes, setup)
    print(f"crossover copy/replicate: {cross if cross is None else f'{cross:.2f}'} nodes")
