"""matplotlib figures as inline SVG text: a characterize page carries its plots inside itself (no
files beside it, no scripts), and a browser's DOM holds each plot as drawn elements."""

from __future__ import annotations

import io
import re
from typing import Any

from mlhpc.common.display.plots import pyplot

_PROLOGUE = re.compile(r"\A.*?(?=<svg)", re.S)


def figure(width: float = 7.0, height: float = 3.4) -> tuple[Any, Any]:
    """A new (figure, axes) on the Agg backend."""
    return pyplot().subplots(figsize=(width, height))


def svg_text(fig: Any) -> str:
    """Lay out, render as SVG and close `fig`; the `<svg>` element alone (no XML prologue)."""
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    pyplot().close(fig)
    return _PROLOGUE.sub("", buffer.getvalue(), count=1)
