"""Words that a browser must not break inside a table cell: a browser wraps after a hyphen or a
slash (`18xR750-2xA100-PCIe-/80GB`, `results/…/strong/` `openfold`), which CSS cannot forbid for
one word alone; each such word of a table's text is wrapped in `<span class="w">` (CSS
`.w{white-space:nowrap}`), so a cell wraps between words only. Torch-free, pure text."""

from __future__ import annotations

import re

STYLE = ".w{white-space:nowrap}"
_TABLE = re.compile(r"<table\b.*?</table>", re.S)
_TEXT = re.compile(r">([^<]+)<")
_BREAKABLE = re.compile(r"[^\s<>]*[-/‐–—][^\s<>]*")


def keep_words(page: str) -> str:
    """`page` with every word holding a hyphen or a slash in a table's text kept on one line."""
    return _TABLE.sub(lambda table: _TEXT.sub(_wrap, table.group(0)), page)


def _wrap(text: re.Match[str]) -> str:
    inner = _BREAKABLE.sub(lambda word: f'<span class="w">{word.group(0)}</span>', text.group(1))
    return f">{inner}<"
