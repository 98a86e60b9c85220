"""Checks every benchmark's dataset reader starts with (no torch here)."""

from __future__ import annotations

from pathlib import Path

from mlhpc.common.errors import DataError

DATASET_COMPLETE = ".mlhpc_generated"
"""In a dataset folder mlhpc generated, written last (see `mlhpc.generation`)."""
DATASET_GENERATING = ".mlhpc_generating"
"""In a dataset folder mlhpc is generating (or was, when killed), written first."""


def existing_data_dir(data_dir: Path | str, benchmark: str) -> Path:
    """`data_dir` as a Path; a DataError with the way out when it is missing."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(
            f"data directory {data_dir} does not exist; drop --data to generate synthetic data "
            f"or run `mlhpc generate {benchmark} --out DIR`"
        )
    return data_dir
