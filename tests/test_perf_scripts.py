"""The perf scripts a GPU session runs, run small on the CPU so that they are ready for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO / "perf"))

from gpu_suite_report import insert_newest_first  # noqa: E402


def test_a_record_goes_in_newest_first(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Measured results\n\nintro\n\n## 2026-01-01: old\n\nold figures\n")
    insert_newest_first(results, "## 2026-02-02: new\n\nnew figures\n")
    text = results.read_text()
    assert text.index("## 2026-02-02: new") < text.index("## 2026-01-01: old")
    assert text.startswith("# Measured results\n\nintro\n") and "old figures" in text


@pytest.mark.slow
def test_gpu_suite_runs_end_to_end_in_its_cpu_smoke_mode(tmp_path: Path) -> None:
    """Install with pip --no-deps into a folder, every step, the dated record: all but the GPU."""
    env = cli_env(OUT=str(tmp_path), GPU_SUITE_SMOKE="1", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(REPO / "perf" / "gpu_suite.sh")], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = (tmp_path / "RESULTS.md").read_text()
    assert "GPU suite" in record
    for row in ("| cosmoflow | fp32 | no |", "| deepcam | fp32 | no |"):
        assert row in record
    assert "cosmoflow mini: aborted in 1 epochs" in record  # the smoke run stops after one epoch
    assert "loop overhead: " in record and "nccl: not run" in record
