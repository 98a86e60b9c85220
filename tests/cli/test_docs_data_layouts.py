"""A wrong benchmark's data is named for what it is: `mlhpc run deepcam --data <CosmoFlow data>`
says "this looks like CosmoFlow data" at once (before the seconds of torch imports, nothing
written), and each benchmark's own missing-file error carries the same hint."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlhpc.common.contract.data_kinds import MAX_LISTED, hint, layout_of, other_layout

LAYOUTS = {
    "cosmoflow": ["train/files_data.lst", "train/a_data.npy", "train/a_label.npy"],
    "deepcam": ["stats.h5", "train/data-0001.h5"],
    "extreme_weather": ["stats.h5", "train/climo_1979.h5"],
}


def _make(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


@pytest.mark.parametrize("benchmark", sorted(LAYOUTS))
def test_each_layout_is_recognised_and_named_for_the_others(tmp_path: Path, benchmark: str) -> None:
    folder = _make(tmp_path / "data", LAYOUTS[benchmark])
    assert layout_of(folder) == benchmark
    assert other_layout(folder, benchmark) is None and hint(folder, benchmark) == ""
    for other in set(LAYOUTS) - {benchmark}:
        line = other_layout(folder, other)
        assert line is not None and f"mlhpc run {benchmark} --data {folder}" in line


def test_unknown_empty_or_missing_folders_are_no_layout(tmp_path: Path) -> None:
    assert layout_of(tmp_path / "nothing") is None
    assert layout_of(_make(tmp_path / "odd", ["train/readme.txt"])) is None
    many = tmp_path / "many"
    _make(many, [f"train/x{i}.txt" for i in range(MAX_LISTED + 5)] + ["train/zz_data.npy"])
    assert layout_of(many) in (None, "cosmoflow")  # bounded listing: never reads the whole folder


def test_run_refuses_another_benchmarks_data_at_once_and_writes_nothing(tmp_path: Path) -> None:
    data = _make(tmp_path / "cosmo", LAYOUTS["cosmoflow"])
    out = tmp_path / "runs"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "run", "deepcam", "--config", "mini", "--data", str(data), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert (
        "this looks like CosmoFlow data, not DeepCAM's" in line
        and f"mlhpc run cosmoflow --data {data}" in line
    )
    assert not out.exists()
    assert "torch" not in proc.stderr and took < 60  # no environment check (torchvision imports) before it


def test_deepcams_missing_stats_error_says_whose_data_it_is(tmp_path: Path) -> None:
    from mlhpc.benchmarks.deepcam.data import read_stats
    from mlhpc.common.errors import DataError

    data = _make(tmp_path / "cosmo", LAYOUTS["cosmoflow"])
    with pytest.raises(DataError, match=r"stats\.h5 is missing.*this looks like CosmoFlow data"):
        read_stats(data, 16)
