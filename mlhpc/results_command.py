"""`mlhpc results add|list|compare`: fill the results store from checks, list it, set one entry
against the published ones of its benchmark (a rich table; with --report a PNG in an HTML page)."""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlhpc.common.errors import MlhpcError, SubmissionError
from mlhpc.common.fileio import atomic_write_text
from mlhpc.results_store import (
    add_reports,
    entry_name,
    fetch_entries,
    find_entry,
    open_store,
)
from mlhpc.submission_checker import check_submission
from mlhpc.submission_checker.compliance import known_rulesets
from mlhpc.submission_checker.ruleset import ruleset_of_folder

REPORT_NAME = "index.html"
PLOT_NAME = "compare.png"
J_PER_KWH = 3.6e6
# (title, column, how shown): what `compare` sets side by side.
FIGURES = (
    ("samples/s per accelerator", "samples_per_s_per_accelerator", "{:.4g}"),
    ("staging share of time to train", "staging_share", "{:.1%}"),
    ("epochs to converge", "epochs", "{:.4g}"),
)


def origin_of(root: Path, requested: str) -> str:
    """'published' when the folder (or, for one organisation, its parent) is named for a round
    (hpc_results_v3.0), else 'ours'; `requested` other than 'auto' decides."""
    if requested != "auto":
        return requested
    names = [root.name, root.parent.name] if (root / "results").is_dir() else [root.name]
    return "published" if any(ruleset_of_folder(n, known_rulesets()) for n in names) else "ours"


def add_command(dirs: Sequence[Path], db: Path, origin: str, jobs: int | None, console: Console) -> int:
    """Check each folder, then store all their entries in one transaction."""
    started = time.perf_counter()
    reports = []
    for folder in dirs:
        if not Path(folder).is_dir():
            raise MlhpcError(
                f"{folder} is not a folder; pass a submission (an organisation's folder or a round's)"
            )
        try:
            report = check_submission(folder, jobs=jobs)
        except SubmissionError as e:
            fix = "" if "; pass " in str(e) else "; pass a submission (an organisation's folder or a round's)"
            raise MlhpcError(f"{e}{fix}") from e
        kind = origin_of(Path(report.root), origin)
        reports.append((report, kind))
        console.print(Text(f"{report.root}: {len(report.entries)} entries, ruleset {report.ruleset}, {kind}"))
    checked = time.perf_counter()
    with open_store(db, create=True) as connection:
        added = add_reports(connection, reports)
    done = time.perf_counter()
    console.print(
        Text(
            f"stored {added.entries} entries ({added.replaced} replaced), {added.runs} runs in {db}: "
            f"{done - started:.1f} s (checks {checked - started:.1f} s, store {done - checked:.2f} s)"
        )
    )
    return 0


def _score(e: dict[str, Any]) -> str:
    if e["scaling"] == "weak":
        return "-" if e["models_per_min"] is None else f"{e['models_per_min']:.4g} models/min"
    return "-" if e["score_min"] is None else f"{e['score_min']:.4g} min"


def _figure(value: Any, form: str) -> str:
    return "-" if value is None else form.format(value)


def _round(e: dict[str, Any]) -> str:
    return f"{'v' + '.'.join(e['ruleset'].split('.')[:2])} {e['origin']}"


def _row(e: dict[str, Any]) -> list[str]:
    energy = e["energy_j"]
    return [
        str(e["id"]),
        _round(e),
        e["submitter"],
        e["system"],
        e["scaling"],
        e["benchmark"],
        _figure(e["nodes"], "{}"),
        _figure(e["accelerators"], "{}"),
        _score(e),
        *(_figure(e[column], form) for _, column, form in FIGURES),
        "-" if energy is None else f"{energy / J_PER_KWH:.4g}",
    ]


HEADERS = ("id", "round", "submitter", "system", "scaling", "benchmark", "nodes", "accel.", "score")
HEADERS_MORE = ("samples/s/accel.", "staging share", "epochs", "energy kWh")


def entries_table(title: str, entries: Sequence[dict[str, Any]], mark: int | None = None) -> Table:
    table = Table(title=Text(title))
    for name in HEADERS[:6]:
        table.add_column(name)
    for name in (*HEADERS[6:], *HEADERS_MORE):
        table.add_column(name, justify="right")
    for e in entries:
        table.add_row(*(Text(v) for v in _row(e)), style="bold" if e["id"] == mark else "")
    return table


def list_command(db: Path, benchmark: str | None, console: Console) -> int:
    with open_store(db, create=False) as connection:
        entries = fetch_entries(connection, *(("benchmark = ?", (benchmark,)) if benchmark else ()))
    console.print(entries_table(f"{len(entries)} entries in {db}", entries))
    return 0


def compare_command(db: Path, name: str, report_dir: Path | None, console: Console) -> int:
    """The entry `name` first, then the published entries of its benchmark."""
    with open_store(db, create=False) as connection:
        entry = find_entry(connection, name, db)
        others = fetch_entries(
            connection,
            "benchmark = ? AND origin = 'published' AND id != ?",
            (entry["benchmark"], entry["id"]),
        )
    title = f"{entry_name(entry)} against {len(others)} published {entry['benchmark']} entries"
    console.print(entries_table(title, [entry, *others], mark=entry["id"]))
    if not others:
        console.print(
            Text(f"no published {entry['benchmark']} entry in {db}; add a round: mlhpc results add DIR")
        )
    if report_dir is not None:
        console.print(Text(f"wrote {write_compare_report(entry, others, Path(report_dir))}"))
    return 0


def _plot(entry: dict[str, Any], others: Sequence[dict[str, Any]]) -> Any:
    """One panel per figure against accelerators per model (log), rounds coloured, the entry a star."""
    from mlhpc.common.plots import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(5 * len(FIGURES), 4.2))
    rounds = sorted({_round(e) for e in others})
    for ax, (label, column, _) in zip(axes, FIGURES, strict=True):
        for number, name in enumerate(rounds):
            points = [
                (e["accelerators"], e[column]) for e in others if _round(e) == name and _plottable(e, column)
            ]
            if points:
                ax.scatter(*zip(*points, strict=True), label=name, color=f"C{number}", alpha=0.75)
        if _plottable(entry, column):
            ax.scatter(
                [entry["accelerators"]],
                [entry[column]],
                marker="*",
                s=260,
                color="red",
                edgecolor="black",
                label=f"{entry['system']} (id {entry['id']})",
                zorder=3,
            )
        ax.set_xscale("log")
        ax.set_xlabel("accelerators per model")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        if column == "staging_share":
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    shown: dict[str, Any] = {}  # each round once, from whichever panel has it
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            shown.setdefault(label, handle)
    axes[-1].legend(list(shown.values()), list(shown), fontsize=8)
    fig.suptitle(f"{entry['benchmark']}: {entry_name(entry)} against the published entries")
    return fig


def _plottable(e: dict[str, Any], column: str) -> bool:
    value, scale = e[column], e["accelerators"]
    return value is not None and math.isfinite(value) and scale is not None and scale > 0


def write_compare_report(entry: dict[str, Any], others: Sequence[dict[str, Any]], folder: Path) -> Path:
    """folder/compare.png and folder/index.html (the table and the plot inline; no downloads)."""
    from mlhpc.common.plots import write_png

    png = write_png(_plot(entry, others), folder / PLOT_NAME)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in (*HEADERS, *HEADERS_MORE))
    rows = "".join(
        f"<tr{' class=mark' if e is entry else ''}>{''.join(f'<td>{html.escape(v)}</td>' for v in _row(e))}</tr>"
        for e in [entry, *others]
    )
    image = base64.b64encode(png.read_bytes()).decode()
    title = html.escape(f"{entry_name(entry)} against the published {entry['benchmark']} entries")
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>'
        "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .5em}tr.mark td{font-weight:bold;background:#fee}"
        f"</style></head><body><h1>{title}</h1><table><tr>{head}</tr>{rows}</table>"
        f'<p><img alt="comparison plot" src="data:image/png;base64,{image}"></p></body></html>\n'
    )
    return atomic_write_text(folder / REPORT_NAME, page)
