"""Figures for the study and report commands: matplotlib without a display, PNGs written whole."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from mlhpc.common.safeio.fileio import atomic_write_bytes


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (batch nodes have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_png(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay out, render and close `fig`, then write it to `path` under a temporary name first."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    pyplot().close(fig)
    return atomic_write_bytes(Path(path), buffer.getvalue())
