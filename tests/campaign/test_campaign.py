"""Campaigns: a strong-scaling campaign that resumes after being killed, a weak-scaling job of
concurrent instances, the time breakdown and `mlhpc report`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlhpc.campaign.resume import finished_runs
from mlhpc.common.training.timing import PHASES
from mlhpc.submission_checker.check import check_submission
from mlhpc.submission_checker.compliance import analyse_logs
from mlhpc.submission_checker.scoring import RunTiming, weak_score
from tests.helpers.cli import cli_env, mlhpc_cli
from tests.helpers.mllog_files import mllog_events

pytestmark = pytest.mark.slow

STRONG = "mlhpc/results/ci/strong/cosmoflow"
# Where the campaign's plumbing is tested and no log is checked, not the training: one epoch on a
# few samples, the loose target met at the first evaluation (--no-check).
TINY = ("data.num_train_samples=64", "data.num_eval_samples=16", "loop.target=10")
# The breakdown needs whole epochs of the mini's 1,024 samples, not the real target: one epoch.
ONE_EPOCH = ("loop.target=10",)


def mlhpc(args: list[str], root: Path, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlhpc", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env=cli_env(MLHPC_LOCAL_DIR=str(root / "local")),
        **popen,
    )


def campaign_args(out: Path, *extra: str, seeds: int = 3) -> list[str]:
    """The mini config as it is: it reaches the official MAE 0.124 in 2-4 epochs for any seed."""
    return [
        "run",
        "cosmoflow",
        "--seeds",
        str(seeds),
        "--out",
        str(out),
        "--system",
        "ci",
        "--no-check",
        *extra,
    ]


def test_killed_campaign_resumes_keeping_finished_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = out / STRONG
    proc = mlhpc(campaign_args(out, "--first-seed", "40"), tmp_path, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (results / "result_0.txt").exists():  # the first run is whole: kill during the second
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run did not finish in 300 s"
        time.sleep(0.2)
    first_log = (results / "result_0.txt").read_bytes()
    assert finished_runs(results.glob("result_*.txt")) == {0: 40}, first_log.decode()[-500:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not (results / "result_2.txt").exists()

    refused = mlhpc(campaign_args(out), tmp_path)
    _, stderr = refused.communicate(timeout=120)
    assert refused.returncode == 2
    assert "--resume" in stderr and "Traceback" not in stderr

    resumed = mlhpc(campaign_args(out, "--resume"), tmp_path)
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr
    assert "kept the finished runs [0]" in stdout
    assert (results / "result_0.txt").read_bytes() == first_log  # kept, not rerun
    assert finished_runs(results.glob("result_*.txt")) == {
        0: 40,
        1: 41,
        2: 42,
    }  # the seeds continue from the kept run
    assert sorted(p.name for p in results.iterdir()) == ["result_0.txt", "result_1.txt", "result_2.txt"]
    assert not list((tmp_path / "local").glob("mlhpc-stage-*"))  # the killed run's too: its owner is gone
    analyses = analyse_logs(sorted(results.glob("result_*.txt")), "3.0.0")
    assert all(a.compliant for a in analyses.values()), [a.messages for a in analyses.values()]


def test_resume_refuses_a_different_config_or_first_seed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = mlhpc(campaign_args(out, "--first-seed", "7", *TINY, seeds=1), tmp_path)
    _, stderr = done.communicate(timeout=900)
    assert done.returncode == 0, stderr
    for extra, expected in (
        (["--first-seed", "9"], "first seed is 7"),
        (["loop.max_epochs=13"], "config"),
    ):
        proc = mlhpc(campaign_args(out, "--resume", *TINY, *extra, seeds=1), tmp_path)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2 and expected in stderr, stderr
        assert stderr.count("\n") == 1, stderr  # one line, no traceback


def test_weak_scaling_instances_train_at_once_and_score(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "cosmoflow", "--instances", "2", "--first-seed", "5", "--out", str(out)]
    proc = mlhpc([*args, "--system", "ci"], tmp_path)
    stdout, stderr = proc.communicate(timeout=900)
    folder = out / "mlhpc/results/ci/weak/cosmoflow"
    logs = sorted(folder.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"], stdout + stderr
    # Two models are a weak entry the checker reads, but not enough for a cosmoflow score (10):
    # a short campaign, a success of its kind.
    assert proc.returncode == 0, stderr
    assert "weak scaling needs at least 10" in stdout
    assert "2 of 10 models: not yet a scoreable entry; train all 10 at once" in stdout

    for index, path in enumerate(logs):
        events = mllog_events(path)
        assert {e["metadata"].get("instance") for e in events} == {index}
        assert [e["value"] for e in events if e["key"] == "seed"] == [5 + index]
        assert [e["value"] for e in events if e["key"] == "number_of_nodes"] == [1]

    analyses = analyse_logs(logs, "3.0.0")
    timings = [
        RunTiming(
            file=p, run_start_ms=a.log.run_start_ms, run_stop_ms=a.log.run_stop_ms, compliant=a.compliant
        )
        for p, a in analyses.items()
    ]
    assert all(t.compliant for t in timings)
    # The instances overlapped in time: they trained at once, not one after the other.
    (first, second) = sorted(timings, key=lambda t: t.run_start_ms)
    assert second.run_start_ms < first.run_stop_ms
    score = weak_score(timings, required_models=2)
    span_min = (max(t.run_stop_ms for t in timings) - min(t.run_start_ms for t in timings)) / 60_000
    assert score is not None and score.num_models == 2
    assert score.models_per_min == pytest.approx(2 / span_min)

    report = check_submission(out / "mlhpc", ruleset="3.0.0")
    (entry,) = report.entries
    assert entry.scaling == "weak" and len(entry.runs) == 2
    rules = {f.rule for f in entry.findings if f.severity == "error"}
    assert rules <= {"run-count", "score"}, entry.findings


def test_breakdown_sums_to_the_run_time_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = mlhpc(campaign_args(out, "--first-seed", "3", *ONE_EPOCH, seeds=1), tmp_path)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    path = out / "breakdown/mlhpc/ci/strong/cosmoflow/result_0.json"
    data = json.loads(path.read_text())
    assert list(data["seconds"]) == list(PHASES)
    assert all(v >= 0 for v in data["seconds"].values())
    assert abs(sum(data["seconds"].values()) - data["total_s"]) <= 0.05 * data["total_s"]
    for phase in ("staging", "data_wait", "forward", "backward", "optimizer", "evaluation"):
        assert data["seconds"][phase] > 0, phase
    # The breakdown's time-to-train is the log's run_start..run_stop.
    events = mllog_events(out / STRONG / "result_0.txt")
    times = {e["key"]: e["time_ms"] for e in events if e["key"] in ("run_start", "run_stop")}
    assert data["time_to_train_s"] == pytest.approx((times["run_stop"] - times["run_start"]) / 1000, abs=0.05)
    # FLOPs: the mini CosmoFlow forward+backward is tens of MFLOP per sample, at a positive rate.
    assert 1e6 < data["flops_per_sample"] < 1e9
    assert data["achieved_flops_per_s"] > 0
    assert data["train_samples_seen"] % 1024 == 0  # whole epochs of the mini's 1,024 samples

    report = mlhpc_cli(["report", str(out), "--plot", str(tmp_path / "b.png")], tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "backward" in report.stdout and "seed 3" in report.stdout
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_report_names_a_bad_breakdown_file(tmp_path: Path) -> None:
    bad = tmp_path / "breakdown/x/result_0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    proc = mlhpc_cli(["report", str(tmp_path)], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and proc.stderr.count("\n") == 1
