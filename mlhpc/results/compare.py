"""`mlhpc results add|list|compare`: fill the results store from checks, list it, set one entry
against the published ones of its benchmark (a rich table; with --report a PNG in an HTML page)."""

from __future__ import annotations

import base64
import html
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlhpc.common.display.html_words import STYLE as WORDS_STYLE
from mlhpc.common.display.html_words import keep_words
from mlhpc.common.display.tables import fitted_table
from mlhpc.common.display.waiting import say_if_slow
from mlhpc.common.errors import MlhpcError, SubmissionError
from mlhpc.common.layout import results_root
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.writable import (
    PNG_KIND,
    SQLITE_KIND,
    generator_meta,
    page_kind,
    refuse_output_over_inputs,
)
from mlhpc.results.store import (
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
GENERATOR = "mlhpc results compare"
"""The page's generator tag: an existing index.html is replaced only when it carries it."""
REPORT_FILES = {REPORT_NAME: page_kind(GENERATOR), PLOT_NAME: PNG_KIND}
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
    names = [root.name, root.parent.name] if results_root(root).is_dir() else [root.name]
    return "published" if any(ruleset_of_folder(n, known_rulesets()) for n in names) else "ours"


def add_command(dirs: Sequence[Path], db: Path, origin: str, jobs: int | None, console: Console) -> int:
    """Check each folder, then store all their entries in one transaction."""
    # The store is written; a store inside a submission it reads would change what it checks.
    refuse_output_over_inputs(db, list(dirs), "--db", kind=SQLITE_KIND)
    if Path(db).exists():  # another program's database or a planted trigger: refused before the checks
        with open_store(db, create=False):
            pass
    started = time.perf_counter()
    reports = []
    missing = [folder for folder in dirs if not Path(folder).is_dir()]
    if len(missing) == len(dirs):
        raise MlhpcError(
            f"{missing[0]} is not a folder; pass a submission (an organisation's folder or a round's)"
        )
    for folder in missing:  # the others are still stored: a typo in one of five rounds loses none
        print(
            shown(f"mlhpc: warning: {folder} is not a folder; skipped, the others are stored"),
            file=sys.stderr,
        )
    for folder in dirs:
        if folder not in missing:
            reports.append(_checked(folder, origin, jobs, console))
    checked = time.perf_counter()
    with open_store(db, create=True) as connection:
        added = add_reports(connection, reports)
    done = time.perf_counter()
    console.print(
        Text(
            shown(
                f"stored {added.entries} entries ({added.replaced} replaced), {added.runs} runs in {db}: "
                f"{done - started:.1f} s (checks {checked - started:.1f} s, store {done - checked:.2f} s)"
            )
        )
    )
    if missing:  # stored, but not all that was asked: said last, and exit status 1
        names = ", ".join(shown(folder) for folder in missing)
        print(
            f"mlhpc: warning: not stored (not a folder): {names}; fix the path and add it again",
            file=sys.stderr,
        )
        return 1
    return 0


def _checked(folder: Path, origin: str, jobs: int | None, console: Console) -> tuple[Any, str]:
    """A submission folder's report and its origin (ours, published), said in one line."""
    try:
        with say_if_slow(f"checking {shown(folder)}"):  # a whole round takes tens of seconds
            report = check_submission(folder, jobs=jobs)
    except SubmissionError as e:
        fix = "" if "; pass " in str(e) else "; pass a submission (an organisation's folder or a round's)"
        raise MlhpcError(f"{e}{fix}") from e
    kind = origin_of(Path(report.root), origin)
    console.print(Text(shown(f"{report.root}: {len(report.entries)} entries, ruleset {report.ruleset}, {kind}")))
    return report, kind


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


NUMBERS = ("id", "nodes", "accel.", *HEADERS_MORE)
# Left out, in this order, while a table is wider than the terminal (named under it).
DROPPABLE = ("energy kWh", "staging share", "epochs", "samples/s/accel.", "nodes", "scaling")


def entries_table(
    title: str, entries: Sequence[dict[str, Any]], mark: int | None = None, width: int = 10_000
) -> Table:
    """One row per entry, fitted to `width` (common/display/tables.py): scores whole, names wrapped."""
    rows = [_row(e) for e in entries]
    styles = ["bold" if e["id"] == mark else "" for e in entries]
    headers = (*HEADERS, *HEADERS_MORE)
    return fitted_table(
        title, headers, rows, width, numbers=NUMBERS, right=("score",), droppable=DROPPABLE, row_styles=styles
    )


def list_command(db: Path, benchmark: str | None, console: Console) -> int:
    with open_store(db, create=False) as connection:
        entries = fetch_entries(connection, *(("benchmark = ?", (benchmark,)) if benchmark else ()))
    console.print(entries_table(f"{len(entries)} entries in {db}", entries, width=console.width))
    return 0


SCALE_RATIO = 10.0
"""Entries whose accelerators per model differ by this factor or more are not compared by default."""


def unlike(entry: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Why `other` is no like-for-like comparison for `entry` (empty when it is one): accelerators an
    order of magnitude apart (or unknown), a smoke configuration on either side, other scaling."""
    reasons = []
    ours, theirs = entry["accelerators"], other["accelerators"]
    if not ours or not theirs:
        reasons.append("accelerators unknown")
    elif max(ours, theirs) / min(ours, theirs) >= SCALE_RATIO:
        reasons.append(f"{theirs} accelerators vs {ours}")
    if other["rcp_verdict"] == "smoke":
        reasons.append("smoke config (mini)")
    elif entry["rcp_verdict"] == "smoke":
        reasons.append("this entry is a smoke config (mini)")
    if other["scaling"] != entry["scaling"]:
        reasons.append(f"{other['scaling']} scaling")
    return reasons


def compare_table(
    title: str,
    entry: dict[str, Any],
    others: Sequence[tuple[dict[str, Any], list[str]]],
    width: int = 10_000,
) -> Table:
    """entries_table with a last column saying why a row is unlike the entry."""
    own = "smoke config (mini)" if entry["rcp_verdict"] == "smoke" else "this entry"
    rows = [[*_row(entry), own], *([*_row(other), "; ".join(reasons)] for other, reasons in others)]
    headers = (*HEADERS, *HEADERS_MORE, "unlike because")
    styles = ["bold", *([""] * len(others))]
    return fitted_table(
        title, headers, rows, width, numbers=NUMBERS, right=("score",), droppable=DROPPABLE, row_styles=styles
    )


def compare_command(
    db: Path, name: str, report_dir: Path | None, console: Console, show_all: bool = False
) -> int:
    """The entry `name` first, then the published entries of its benchmark of like scale and
    configuration (`show_all`: every one, the unlike ones marked with why)."""
    if report_dir is not None:  # judged first: the page may not land on the store it reads
        report_dir = refuse_output_over_inputs(report_dir, [db], "--report", folder=True, writes=REPORT_FILES)
    with open_store(db, create=False) as connection:
        entry = find_entry(connection, name, db)
        published = fetch_entries(
            connection,
            "benchmark = ? AND origin = 'published' AND id != ?",
            (entry["benchmark"], entry["id"]),
        )
    marked = [(other, unlike(entry, other)) for other in published]
    shown_rows = marked if show_all else [(o, r) for o, r in marked if not r]
    left_out = len(marked) - len(shown_rows)
    kind = "published" if show_all else "like published"
    title = f"{entry_name(entry)} against {len(shown_rows)} {kind} {entry['benchmark']} entries"
    console.print(compare_table(title, entry, shown_rows, width=console.width))
    if left_out:
        why = sorted({reason for _, reasons in marked for reason in reasons})
        console.print(
            Text(
                shown(
                    f"{left_out} published entries of unlike scale or config left out ({'; '.join(why)}); --all shows them, marked"
                )
            )
        )
    if not published:
        console.print(
            Text(
                shown(f"no published {entry['benchmark']} entry in {db}; add a round: mlhpc results add DIR")
            )
        )
    if report_dir is not None:
        console.print(Text(shown(f"wrote {write_compare_report(entry, shown_rows, Path(report_dir))}")))
    return 0


def _plot(
    entry: dict[str, Any], others: Sequence[dict[str, Any]], unlike: frozenset[int] = frozenset()
) -> Any:
    """One panel per figure against accelerators per model (log), rounds coloured, the entry a star;
    the entries of `unlike` ids (other scale or config) hollow, with their own legend entry, so the
    plot itself says which points are not comparable."""
    from mlhpc.common.display.plots import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(5 * len(FIGURES), 4.2))
    for ax, (label, column, _) in zip(axes, FIGURES, strict=True):
        _panel(ax, column, entry, others, unlike)
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
    fig.suptitle(_label(f"{entry['benchmark']}: {entry_name(entry)} against the published entries"))
    return fig


def _panel(
    ax: Any, column: str, entry: dict[str, Any], others: Sequence[dict[str, Any]], unlike: frozenset[int]
) -> None:
    """One figure's points: each round's entries (hollow when unlike), then the entry's star."""
    for number, name in enumerate(sorted({_round(e) for e in others})):
        for hollow in (False, True):
            points = [
                (e["accelerators"], e[column])
                for e in others
                if _round(e) == name and _plottable(e, column) and (e["id"] in unlike) == hollow
            ]
            if points and hollow:
                ax.scatter(*zip(*points, strict=True), facecolors="none", edgecolors=f"C{number}", linewidths=1.5)
            elif points:
                ax.scatter(*zip(*points, strict=True), label=_label(name), color=f"C{number}", alpha=0.75)
    if unlike and any(e["id"] in unlike and _plottable(e, column) for e in others):
        ax.scatter([], [], facecolors="none", edgecolors="grey", label="hollow: unlike (other scale or config)")
    if _plottable(entry, column):
        smoke = ", smoke config: unlike all" if entry.get("rcp_verdict") == "smoke" else ""
        ax.scatter(
            [entry["accelerators"]],
            [entry[column]],
            marker="*",
            s=260,
            color="red",
            edgecolor="black",
            label=_label(f"{entry['system']} (id {entry['id']}){smoke}"),
            zorder=3,
        )


def _label(text: str) -> str:
    """A name in a plot: shown as data, its `$` not taken for mathtext."""
    return shown(text).replace("$", r"\$")


def _plottable(e: dict[str, Any], column: str) -> bool:
    value, scale = e[column], e["accelerators"]
    return value is not None and math.isfinite(value) and scale is not None and scale > 0


def _e(text: object) -> str:
    """Text from outside in a page: control and bidi characters escaped, then HTML-escaped."""
    return html.escape(shown(text))


PAGE_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222;overflow-wrap:anywhere}"
    ".wide{max-width:100%;overflow-x:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;overflow-wrap:normal;word-break:keep-all}"
    "th{white-space:nowrap}"
    "tr.mark td{font-weight:bold;background:#fee}tr.unlike td{color:#888}"
    "img,svg{max-width:100%;height:auto}"
)
"""Fits a 1200 px window: a cell wraps between words only (never inside a name or a number), a
table wider than the page scrolls inside its box, the plot shrinks."""


def write_compare_report(
    entry: dict[str, Any], rows: Sequence[tuple[dict[str, Any], list[str]]], folder: Path
) -> Path:
    """folder/compare.png and folder/index.html (the table and the plot inline; no downloads).
    `rows`: the published entries shown, each with why it is unlike `entry` (empty: like)."""
    from mlhpc.common.display.plots import write_png

    unlike = frozenset(other["id"] for other, reasons in rows if reasons)
    png = write_png(_plot(entry, [other for other, _ in rows], unlike), folder / PLOT_NAME)
    head = "".join(f"<th>{_e(h)}</th>" for h in (*HEADERS, *HEADERS_MORE, "unlike because"))
    own = "smoke config (mini)" if entry["rcp_verdict"] == "smoke" else "this entry"
    lines = [("mark", [*_row(entry), own])]
    lines += [("unlike" if reasons else "", [*_row(other), "; ".join(reasons)]) for other, reasons in rows]
    body = "".join(
        f"<tr{f' class={cls}' if cls else ''}>{''.join(f'<td>{_e(v)}</td>' for v in cells)}</tr>"
        for cls, cells in lines
    )
    image = base64.b64encode(png.read_bytes()).decode()
    title = _e(f"{entry_name(entry)} against the published {entry['benchmark']} entries")
    page = keep_words(  # a cell never breaks a word at its hyphen or slash
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{generator_meta(GENERATOR)}<title>{title}</title>'
        f"<style>{PAGE_STYLE}{WORDS_STYLE}</style></head><body><h1>{title}</h1>"
        f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'
        f'<p><img alt="comparison plot" src="data:image/png;base64,{image}"></p></body></html>\n'
    )
    return atomic_write_text(folder / REPORT_NAME, page)
