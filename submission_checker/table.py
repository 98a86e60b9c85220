"""`mlhpc check`'s table at the width it is shown in: the numbers (score, raw time, models per
minute) never wrap or get cut; where the full table is too wide, who/where columns fold into one
`entry` column and then the side figures are left out (and named), and the verdict line repeats
each entry's score, so a narrow terminal still reads the result in full."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlhpc.common.printable import shown

from .report import CheckReport, EntryReport

NUMBERS = ("raw min", "score min", "models/min")
# Left out, in this order, while the table is wider than the console (named in the caption).
DROPPABLE = ("models/min", "raw min", "RCP")
MAX_SCORES_IN_VERDICT = 4
MIN_FOLDED = 6
"""The narrowest a text column folds to when even the narrowest layout is too wide."""


def minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def entry_name(e: EntryReport) -> str:
    return f"{e.submitter}/{e.system}/{e.scaling}/{e.benchmark}"


def fitted_table(
    report: CheckReport,
    console: Console,
    cells: Callable[[EntryReport], dict[str, str | Text]],
    title: str,
) -> Table:
    """The widest layout that fits `console`: every column; then submitter/system/scaling/benchmark
    as one folded `entry` column; then DROPPABLE left out one by one. `cells(e)` gives a row's text
    by column name (submitter, system, scaling, benchmark, runs, raw min, RCP, score min,
    models/min, findings)."""
    rows = [cells(e) for e in report.entries]
    layouts = [(False, ())] + [(True, DROPPABLE[:drop]) for drop in range(len(DROPPABLE) + 1)]
    for merged, left_out in layouts:
        columns, shown_rows = _layout(rows, merged=merged, left_out=left_out)
        if _needed(columns, use=0) <= console.width:  # no word must break: each column its longest word
            break
    return _table(columns, shown_rows, title, left_out, console.width)


Column = tuple[str, int, int]
"""(name, longest word, longest text) of a column."""


def _layout(
    rows: list[dict[str, str | Text]], *, merged: bool, left_out: tuple[str, ...]
) -> tuple[list[Column], list[dict[str, str | Text]]]:
    names = ["submitter", "system", "scaling", "benchmark"]
    if merged:  # spaces, not slashes: the folded column wraps between the names, not inside one
        rows = [{**r, "entry": " ".join(str(r[k]) for k in names)} for r in rows]
        names = ["entry"]
    figures = [n for n in ("raw min", "RCP", "score min", "models/min") if n not in left_out]
    columns = []
    for name in [*names, "runs", *figures, "findings"]:
        texts = [name, *(str(r[name]) for r in rows)]
        word = max(len(w) for text in texts for w in text.split() or [""])
        longest = max(len(text) for text in texts)
        columns.append((name, longest if name in NUMBERS else word, longest))
    return columns, rows


def _needed(columns: list[Column], use: int) -> int:
    """The table's width with each column at its shortest (use 0) or longest (use 1) width:
    a border on the left, then per column its padding (2) and a border."""
    return 1 + sum(column[1 + use] + 3 for column in columns)


def _table(
    columns: list[Column],
    rows: list[dict[str, str | Text]],
    title: str,
    left_out: tuple[str, ...],
    width: int,
) -> Table:
    """The table with each column's width set here (rich's own squeeze breaks words and crops):
    each column its longest word, then the room left given to the columns nearest to whole first."""
    spare = max(0, width - _needed(columns, use=0))
    widths = {}
    for name, shortest, longest in sorted(columns, key=lambda c: c[2] - c[1]):  # the nearest whole first
        widths[name] = shortest + min(spare, longest - shortest)
        spare -= widths[name] - shortest
    over = _needed(columns, use=0) - width
    while over > 0:  # a word longer than the room: the widest text column folds inside it, never a number
        name = max((c for c in widths if c not in NUMBERS), key=lambda c: widths[c])
        cut = min(over, widths[name] - MIN_FOLDED)
        if cut <= 0:
            break
        widths[name] -= cut
        over -= cut
    table = Table(title=Text(shown(title)))
    for name, _, _ in columns:
        right = "right" if name in ("raw min", "RCP", "score min", "models/min") else "left"
        table.add_column(name, justify=right, width=widths[name], no_wrap=name in NUMBERS, overflow="fold")
    for r in rows:
        table.add_row(*(r[c[0]] if isinstance(r[c[0]], Text) else Text(shown(str(r[c[0]]))) for c in columns))
    if left_out:
        table.caption = f"left out to fit {', '.join(left_out)}: widen the terminal, or --json/--csv"
    return table


def scores_text(report: CheckReport) -> str:
    """`; score <entry> <min> min` for each scored entry (a few), for the verdict line."""
    scored = [e for e in report.entries if e.score_min is not None]
    if not scored or len(scored) > MAX_SCORES_IN_VERDICT:
        return ""
    if len(report.entries) == 1:
        return f"; score {minutes(scored[0].score_min)} min"
    return "; scores " + ", ".join(f"{shown(entry_name(e))} {minutes(e.score_min)} min" for e in scored)
