"""Which benchmark's on-disk layout a data folder has, from a few names (torch-free, reads no
file): so that `mlhpc run deepcam --data <CosmoFlow data>` is refused at once with "this looks
like CosmoFlow data", not after seconds of imports with "stats.h5 is missing"."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from mlhpc.common.printable import shown

NAMES = {"cosmoflow": "CosmoFlow", "deepcam": "DeepCAM", "extreme_weather": "ExtremeWeather"}
# (files at the root, a pattern of train/'s files) that only that benchmark's layout has.
MARKERS = {
    "cosmoflow": ((), ("files_data.lst", "*_data.npy", "*_label.npy")),
    "deepcam": (("stats.h5",), ("data-*.h5", "data-*.npy", "label-*.npy")),
    "extreme_weather": ((), ("climo_*.h5",)),
}
MAX_LISTED = 256
"""train/ entries looked at: enough to see the layout, bounded on a folder of millions."""


def layout_of(folder: Path) -> str | None:
    """The benchmark whose layout `folder` has, or None (not a folder, empty, or unknown)."""
    folder = Path(folder)
    names = _names(folder / "train")
    if not names:
        return None
    for benchmark, (root_files, patterns) in MARKERS.items():
        if all((folder / name).is_file() for name in root_files) and any(
            fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns
        ):
            return benchmark
    return None


def _names(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            names = []
            for entry in entries:
                names.append(entry.name)
                if len(names) >= MAX_LISTED:
                    break
            return names
    except OSError:
        return []


def other_layout(folder: Path, benchmark: str) -> str | None:
    """`this looks like CosmoFlow data ...` when `folder` has another benchmark's layout, else None."""
    found = layout_of(folder)
    if found is None or found == benchmark or benchmark not in NAMES:
        return None
    return (
        f"this looks like {NAMES[found]} data, not {NAMES[benchmark]}'s; pass the {NAMES[benchmark]} "
        f"dataset (see docs/DATASETS.md), or train it: mlhpc run {found} --data {shown(folder)}"
    )


def hint(folder: Path, benchmark: str) -> str:
    """`; this looks like ... data ...` for the end of a data error line, or ''."""
    other = other_layout(folder, benchmark)
    return "" if other is None else f"; {other}"
