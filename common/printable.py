"""Names from outside shown as data: a folder called `\x1b[2K\rPASSED` must print as those
characters, not move the cursor. Used for every name a terminal line or an HTML page shows.
Torch-free."""

from __future__ import annotations

import unicodedata

# Bidirectional overrides and isolates reorder what follows them on screen (Trojan Source).
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _hidden(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") or char in _BIDI


def shown(text: object) -> str:
    """`text` with every control, format or line-separator character written as a `\\x..` or
    `\\u....` escape, so one name is one visible line; plain text comes back unchanged."""
    text = str(text)
    if not any(_hidden(char) for char in text):
        return text
    out = []
    for char in text:
        if not _hidden(char):
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)
