"""A rich table that fits its terminal without breaking a number: columns sized here (rich's own
squeeze breaks words and cuts numbers into `0.45…`). Number columns never wrap; text columns
wrap between words; columns whose every value is `-` go first, then the `droppable` ones in
order (named in the caption); only when even that is too wide does the widest text column fold
inside a word."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from mlhpc.common.printable import shown

MIN_FOLDED = 6
"""The narrowest a text column folds to when even the narrowest layout is too wide."""


def fitted_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str | Text]],
    width: int,
    *,
    numbers: Sequence[str] = (),
    right: Sequence[str] = (),
    droppable: Sequence[str] = (),
    row_styles: Sequence[str] | None = None,
) -> Table:
    """`rows` under `headers` in at most `width` columns; `numbers` are right-aligned and whole,
    `right` right-aligned text (a number and its unit: wraps between them, never inside)."""
    keep = [h for i, h in enumerate(headers) if h not in droppable or any(str(r[i]) != "-" for r in rows)]
    left_out = [h for h in headers if h not in keep]
    for name in [*droppable, None]:
        columns = _columns(headers, rows, keep, numbers)
        if _needed(columns.values(), 0) <= width or name is None:
            break
        if name in keep:
            keep.remove(name)
            left_out.append(name)
    widths = _widths(columns, width, numbers)
    table = Table(title=Text(shown(title)))
    for name in keep:
        justify = "right" if name in numbers or name in right else "left"
        table.add_column(name, justify=justify, width=widths[name], no_wrap=name in numbers, overflow="fold")
    for i, row in enumerate(rows):
        cells = [row[headers.index(name)] for name in keep]
        style = row_styles[i] if row_styles else ""
        table.add_row(*(c if isinstance(c, Text) else Text(shown(c)) for c in cells), style=style)
    shown_out = [h for h in left_out if any(str(r[headers.index(h)]) != "-" for r in rows)]
    if shown_out:
        table.caption = f"left out to fit: {', '.join(shown_out)} (a wider terminal shows them)"
    return table


def _columns(
    headers: Sequence[str], rows: Sequence[Sequence[str | Text]], keep: list[str], numbers: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """{name: (shortest, longest)}: a text column's longest word and a number's whole text."""
    found = {}
    for name in keep:
        texts = [name, *(shown(str(r[headers.index(name)])) for r in rows)]
        longest = max(len(t) for t in texts)
        word = max(len(w) for t in texts for w in t.split() or [""])
        found[name] = (longest if name in numbers else word, longest)
    return found


def _needed(columns: object, use: int) -> int:
    """A border on the left, then per column its padding (2) and a border."""
    return 1 + sum(c[use] + 3 for c in columns)  # type: ignore[attr-defined]


def _widths(columns: dict[str, tuple[int, int]], width: int, numbers: Sequence[str]) -> dict[str, int]:
    """Each column its shortest, the room left to the columns nearest to whole first; when even
    that is too wide, the widest text columns fold (never a number)."""
    spare = width - _needed(columns.values(), 0)
    widths = {name: shortest for name, (shortest, _) in columns.items()}
    for name, (shortest, longest) in sorted(columns.items(), key=lambda c: c[1][1] - c[1][0]):
        extra = max(0, min(spare, longest - shortest))
        widths[name] += extra
        spare -= extra
    texts = [name for name in widths if name not in numbers]
    for floor in (MIN_FOLDED, 1):  # a readable fold first; a number still never breaks
        while spare < 0 and texts:
            name = max(texts, key=lambda n: widths[n])
            cut = min(-spare, widths[name] - floor)
            if cut <= 0:
                break
            widths[name] -= cut
            spare += cut
    return widths
