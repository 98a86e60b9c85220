"""The perf scripts a GPU session runs, run small on the CPU so that they are ready for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "perf"))

from gpu_suite_report import insert_newest_first  # noqa: E402


def test_a_record_goes_in_newest_first(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Measured results\n\nintro\n\n## 2026-01-01: old\n\nold figures\n")
    insert_newest_first(results, "## 2026-02-02: new\n\nnew figures\n")
    text = results.read_text()
    assert text.index("## 2026-02-02: new") < text.index("## 2026-01-01: old")
    assert text.startswith("# Measured results\n\nintro\n") and "old figures" in text


RECORD = "## 2026-11-28: GPU suite, NVIDIA H100 80GB HBM3\n\n| step | limit (s) | took (s) | outcome |\n"


def merge(record: Path, results: Path) -> subprocess.CompletedProcess[str]:
    script = REPO / "perf" / "gpu_suite_report.py"
    return subprocess.run(
        [sys.executable, str(script), "--merge", str(record), "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_returned_gpu_record_merges_newest_first_once(tmp_path: Path) -> None:
    """The suite's gpu_suite.md (the GPU suite's rehearsal: tests/perf/test_gpu_suite_rehearsal.py) goes
    into RESULTS.md with one command, above the older records; the same record twice is refused."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Measured results\n\nintro\n\n## 2026-01-01: old\n\nold figures\n")
    record = tmp_path / "gpu_suite.md"
    record.write_text(RECORD)
    assert merge(record, results).returncode == 0
    text = results.read_text()
    assert text.index("GPU suite, NVIDIA H100") < text.index("## 2026-01-01: old")
    again = merge(record, results)
    assert again.returncode != 0 and "already holds" in again.stderr
    assert results.read_text() == text


@pytest.mark.parametrize(
    "content, why",
    [
        (b"# not the suite's record\n", "does not open with"),
        (b"## 2026-11-28: GPU suite\n\xff\xfe", "not UTF-8"),
        (b"## 2026-11-28: GPU suite\n" + b"x" * 300_000, "regular file of at most"),
        (b"## 2026-11-28: GPU suite\n\0", "does not open with"),
    ],
    ids=["other-heading", "not-utf8", "too-large", "nul-byte"],  # an id made of 300 kB would reach argv
)
def test_a_returned_record_that_is_not_one_is_refused_in_one_line(
    tmp_path: Path, content: bytes, why: str
) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Measured results\n")
    record = tmp_path / "gpu_suite.md"
    record.write_bytes(content)
    proc = merge(record, results)
    assert proc.returncode != 0 and why in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert results.read_text() == "# Measured results\n"


def test_a_fifo_given_as_the_record_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "gpu_suite.md"
    os.mkfifo(fifo)
    proc = merge(fifo, tmp_path / "RESULTS.md")
    assert proc.returncode != 0 and "not a regular file" in proc.stderr
    assert not (tmp_path / "RESULTS.md").exists()
