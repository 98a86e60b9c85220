"""perf/peer_speed.py's measuring part: a process tree's CPU-seconds, CPU at an instant, and the
training spans read from an MLLOG file. The runs themselves need TensorFlow and a checkout of
mlcommons/hpc, which CI has not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "perf"))

from peer_speed import Span, cpu_at, per_second, training_spans, tree_cpu_seconds  # noqa: E402

BUSY = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_a_tree_counts_its_children_alive_and_reaped() -> None:
    """A parent that keeps one busy child alive and has reaped another: both children's CPU."""
    parent = f"""
import subprocess, sys, time
subprocess.run([sys.executable, "-c", {BUSY.format(s=0.6)!r}])
alive = subprocess.Popen([sys.executable, "-c", {BUSY.format(s=0.6)!r} + "time.sleep(30)"])
time.sleep(30)
"""
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while tree_cpu_seconds(proc.pid) < 1.2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 1.2 <= tree_cpu_seconds(proc.pid) < 5
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the parent and the child it keeps
        proc.wait()


def test_cpu_is_interpolated_between_samples() -> None:
    samples = [(100.0, 1.0), (101.0, 2.0), (102.0, 4.0)]
    assert cpu_at(samples, 100.5) == pytest.approx(1.5)
    assert cpu_at(samples, 101.75) == pytest.approx(3.5)
    with pytest.raises(SystemExit, match="no CPU sample around 103"):
        cpu_at(samples, 103.0)


def write_mllog(path: Path, events: list[tuple[str, float]]) -> Path:
    lines = ["some other output"]
    for key, seconds in events:
        record = {"namespace": "", "time_ms": int(seconds * 1000), "event_type": "INTERVAL_START", "key": key,
                  "value": None, "metadata": {}}  # fmt: skip
        lines.append(":::MLLOG " + json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_spans_leave_out_the_first_epoch_and_the_evaluations(tmp_path: Path) -> None:
    log = write_mllog(
        tmp_path / "log",
        [("run_start", 100), ("epoch_start", 100), ("eval_start", 130), ("epoch_start", 131),
         ("eval_start", 141), ("epoch_start", 143), ("eval_start", 155), ("run_stop", 156)],
    )  # fmt: skip
    samples = [(float(t), 2.0 * (t - 100)) for t in range(99, 160)]  # two busy threads
    spans = training_spans(log, samples, per_epoch=8)
    assert spans == [Span(10.0, 20.0, 8), Span(12.0, 24.0, 8)]
    assert per_second(spans) == pytest.approx((16 / 22, 16 / 44))
    with pytest.raises(SystemExit, match="fewer than two epochs logged"):
        training_spans(write_mllog(tmp_path / "short", [("epoch_start", 100), ("eval_start", 110)]), samples, 8)
