"""`mlhpc status OUT`: a toy campaign's seeds read back as done, failed, interrupted, running
(a held run lock, or squeue says so), queued (squeue/sacct, or only jobs.json) and not started,
with the next command; nothing in OUT is created or changed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlhpc.campaign.status import campaign_status, next_command
from mlhpc.cli import main
from mlhpc.common.errors import SubmissionError

FIRST = 1000
SYSTEM = "toy_cpu_n1"


def _log(status: str | None) -> str:
    lines = [
        {"key": "run_start", "value": None, "time_ms": 1000, "metadata": {}},
        {"key": "seed", "value": 0, "time_ms": 1001, "metadata": {}},
    ]
    if status is not None:
        lines.append({"key": "run_stop", "value": None, "time_ms": 2000, "metadata": {"status": status}})
    return "".join(f":::MLLOG {json.dumps(line)}\n" for line in lines)


def _campaign(out: Path, runs: int = 6, logs: dict[int, str | None] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "mlhpc_campaign": 2,
        "hardware": SYSTEM,
        "settings": {
            "submitter": "mlhpc",
            "system": SYSTEM,
            "division": "closed",
            "status": "onprem",
            "ruleset": "3.0.0",
        },
        "entries": {
            "toy/strong": {"config": "mini", "config_id": "0" * 16, "num_runs": runs, "first_seed": FIRST}
        },
    }
    (out / "campaign.json").write_text(json.dumps(record))
    folder = out / "mlhpc" / "results" / SYSTEM / "strong" / "toy"
    folder.mkdir(parents=True)
    for index, status in (logs or {}).items():
        (folder / f"result_{index}.txt").write_text(_log(status))
    return out


def _snapshot(out: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in out.rglob("*")}


def _states(out: Path) -> list[str]:
    _, entries = campaign_status(out)
    return [s.state for s in entries[0].seeds]


def test_done_failed_interrupted_and_not_started_from_the_files(tmp_path: Path, capsys) -> None:
    out = _campaign(tmp_path / "runs", runs=4, logs={0: "success", 1: "aborted", 2: None})
    before = _snapshot(out)
    assert _states(out) == ["done", "failed", "interrupted", "not started"]
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 seeds, 1 done, 1 failed, 1 interrupted, 1 not started" in text
    assert f"seed {FIRST + 1}" in text and "run_stop aborted" in text
    assert f"--seeds 4 --out {out} --data DATA --resume" in text.splitlines()[-1]
    assert _snapshot(out) == before  # read-only: nothing created, nothing touched


def test_all_done_says_check(tmp_path: Path) -> None:
    out = _campaign(tmp_path / "runs", runs=2, logs={0: "success", 1: "success"})
    (out / "datasets" / "toy-mini").mkdir(parents=True)
    record, entries = campaign_status(out)
    assert (
        next_command(out, record, entries)
        == f"next: all done; check the submission: mlhpc check {out / 'mlhpc'}"
    )


def test_a_held_run_lock_is_running_and_stays_unlocked_after(tmp_path: Path) -> None:
    out = _campaign(tmp_path / "runs", runs=2, logs={0: "success"})
    lock = out / ".mlhpc-runs" / f"mlhpc-{SYSTEM}-strong-toy-1" / ".mlhpc.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("{}")
    assert _states(out) == ["done", "not started"]  # a lock file nobody holds is not a run
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({str(lock)!r}, os.O_RDWR)
            fcntl.lockf(fd, fcntl.LOCK_EX)
            print("held", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _states(out) == ["done", "running"]
        record, entries = campaign_status(out)
        assert next_command(out, record, entries).startswith("next: wait for the 1 running")
    finally:
        holder.communicate("")
    assert _states(out) == ["done", "not started"]


def _fake_slurm(bin_dir: Path, squeue: str, sacct: str) -> None:
    bin_dir.mkdir()
    for name, answer in (("squeue", squeue), ("sacct", sacct)):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\necho \"$*\" >> {bin_dir}/{name}.args\nprintf '{answer}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _jobs(out: Path, runs: int) -> None:
    (out / "slurm").mkdir()
    seeds = {str(i): {"job": str(500 + i), "seed": FIRST + i} for i in range(runs)}
    seeds["9"] = {"job": "1;rm -rf /", "seed": 1}  # planted: never reaches squeue
    (out / "slurm" / "jobs.json").write_text(json.dumps({"generate": None, "seeds": seeds, "check": "599"}))


def test_slurm_jobs_read_from_squeue_and_sacct(tmp_path: Path, monkeypatch) -> None:
    out = _campaign(tmp_path / "runs", runs=5, logs={0: "success"})
    _jobs(out, 5)
    _fake_slurm(
        tmp_path / "bin", squeue="501 RUNNING\\n502 PENDING\\n", sacct="503|FAILED\\n504|CANCELLED by 1000\\n"
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    _, entries = campaign_status(out)
    assert [(s.state, s.detail) for s in entries[0].seeds] == [
        ("done", "result_0.txt"),
        ("running", "Slurm job 501"),
        ("queued", "Slurm job 502, pending"),
        ("failed", "Slurm job 503 failed, no result"),
        ("failed", "Slurm job 504 cancelled, no result"),
    ]
    asked = (tmp_path / "bin" / "squeue.args").read_text()
    assert "500,501,502,503,504" in asked and "rm" not in asked
    assert "503,504" in (tmp_path / "bin" / "sacct.args").read_text()


def test_slurm_jobs_without_squeue_fall_back_to_the_files(tmp_path: Path, monkeypatch) -> None:
    out = _campaign(tmp_path / "runs", runs=2, logs={0: "success"})
    _jobs(out, 2)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    _, entries = campaign_status(out)
    assert [s.state for s in entries[0].seeds] == ["done", "queued"]
    assert "squeue/sacct not here to ask" in entries[0].seeds[1].detail


def test_not_a_campaign_is_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SubmissionError, match=r"holds no campaign\.json"):
        campaign_status(tmp_path)
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
