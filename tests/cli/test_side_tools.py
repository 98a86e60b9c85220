"""The side tools at human size: `mlhpc report` a table per campaign no wider than the terminal
(everything in its JSON/CSV), `mlhpc variability` never silent for long, `say_if_slow` itself."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import time
from pathlib import Path

import pytest

from mlhpc.cli import main
from mlhpc.common.display.waiting import say_if_slow
from mlhpc.common.training.timing import PHASES
from mlhpc.results.variability import MAX_RUNS, _olympic_se_table, olympic_se_factor, runs_needed


def write_campaigns(root: Path, names: tuple[str, ...] = ("a", "b"), runs: int = 10) -> None:
    """`runs` breakdowns in each of two campaigns' --out folders under `root`."""
    for name in names:
        folder = root / name / "breakdown" / "mlhpc" / "host_cpu_n1" / "strong" / "cosmoflow"
        folder.mkdir(parents=True)
        for index in range(runs):
            seconds = {phase: 0.5 * (number + 1) for number, phase in enumerate(PHASES)}
            (folder / f"result_{index}.json").write_text(
                json.dumps(
                    {
                        "seed": 1_234_567_890 + index,
                        "seconds": seconds,
                        "time_to_train_s": sum(seconds.values()),
                        "init_s": 1.0,
                        "flops_per_sample": 1e8,
                        "achieved_flops_per_s": 3e10,
                        "train_samples_seen": 1024,
                        "settings": {"device": "cpu", "precision": "fp32", "loader": "torch"},
                    }
                )
            )


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_report_is_a_table_per_campaign_no_wider_than_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], columns: int
) -> None:
    """It printed one ~200-column table, every campaign merged, wrapping at 160 columns."""
    write_campaigns(tmp_path / "runs")
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["report", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= columns
    for name in ("a", "b"):
        assert f"{name}/breakdown/mlhpc/host_cpu_n1/strong/cosmoflow (10 runs)" in " ".join(out.split())
    assert "left out for the terminal's width: init" in out  # the smallest phase goes first


def test_report_on_a_wide_terminal_leaves_nothing_out_and_json_csv_hold_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_campaigns(tmp_path / "runs")
    monkeypatch.setenv("COLUMNS", "250")
    report_json, report_csv = tmp_path / "r.json", tmp_path / "r.csv"
    argv = ["report", str(tmp_path / "runs"), "--json", str(report_json), "--csv", str(report_csv)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "left out" not in out
    assert all(phase in out for phase in PHASES) and "0 (seed 1234567890)" in out
    data = json.loads(report_json.read_text())
    assert [c["entry"] for c in data["campaigns"]] == [
        f"{name}/breakdown/mlhpc/host_cpu_n1/strong/cosmoflow" for name in ("a", "b")
    ]
    assert all(
        len(c["runs"]) == 10 and set(c["runs"][0]["seconds"]) == set(PHASES) for c in data["campaigns"]
    )
    rows = list(csv.DictReader(io.StringIO(report_csv.read_text())))
    assert len(rows) == 20 and len(set(rows[0])) == len(rows[0])  # no column named twice
    assert float(rows[0]["phase_evaluation_s"]) == pytest.approx(0.5 * len(PHASES))


def test_a_quick_step_says_nothing_and_a_slow_one_one_line() -> None:
    stream = io.StringIO()
    with say_if_slow("counting", after_s=0.5, stream=stream):
        pass
    assert stream.getvalue() == ""
    with say_if_slow("reading 40 logs", after_s=0.05, stream=stream):
        time.sleep(0.4)
    assert stream.getvalue() == "mlhpc: reading 40 logs ...\n"


def test_a_slow_step_at_a_terminal_spins_and_stops(tmp_path: Path) -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        with say_if_slow("reading 40 logs", after_s=0.05, stream=terminal):
            time.sleep(0.5)
        terminal.flush()
        shown = os.read(leader, 65536).decode("utf-8", "replace")
    os.close(leader)
    assert "reading 40 logs ..." in shown


def test_the_run_counts_simulate_once_not_once_per_campaign_size() -> None:
    """`runs_needed` scanned to 200 runs, simulating each campaign size anew: 25 s of silence. The
    whole scan now costs one simulation (how long that takes is perf/'s business, not a test's)."""
    _olympic_se_table.cache_clear()
    assert runs_needed(5.0, 0.01) is None  # the whole scan, to MAX_RUNS
    assert _olympic_se_table.cache_info().misses == 1
    table = [olympic_se_factor(n) for n in range(3, MAX_RUNS + 1)]
    assert all(a > b for a, b in itertools.pairwise(table))  # shared draws: no noise reordering
