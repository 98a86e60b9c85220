"""AIPerf across two hosts of the session's virtual cluster (scripts/vcluster): `mlhpc run aiperf
--config mini --slurm --slurm-nodes 2`, one job whose srun step runs one trial a node, the nodes
sharing the search through the study's journal file in the cluster's shared folder. Partway
through, node02's trial process is killed (SIGKILL): node01 goes on to the deadline, node02's
finished epochs still count, and the job's own `mlhpc check` scores the run, valid at the mini
config's own threshold.

The clients (mlhpc run --slurm, sbatch) run on `login`, never in the host's own network namespace;
the kill is of the processes whose environment says they run on node02 (the hosts share the
machine's process table).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.vclusterlib.client import kill_on_node
from tests.helpers.vcluster_fixture import VCluster

pytestmark = pytest.mark.cluster

MINUTES = 1.0
KILL_AFTER_S = 35.0


@pytest.fixture
def work(vcluster: VCluster) -> Iterator[Path]:
    folder = vcluster.shared / f"aiperf-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_slurm_job_of_two_nodes_searches_loses_one_and_is_scored_valid(vcluster: VCluster, work: Path) -> None:
    """`mlhpc run aiperf --slurm --slurm-nodes 2` from the login host: one job whose srun step runs
    both nodes; node02 is killed partway and the job's own `mlhpc check` scores the run."""
    data, out = work / "data", work / "out"
    vcluster.exec("login", ["mlhpc", "generate", "aiperf", "--config", "mini", "--out", str(data)], timeout=120)
    command = ["mlhpc", "run", "aiperf", "--config", "mini", "--data", str(data), "--out", str(out),
               "--slurm", "--slurm-nodes", "2", "--slurm-time", "00:10:00", f"search.duration_minutes={MINUTES}"]
    submitted = vcluster.exec("login", command, cwd=work, timeout=120)
    job = json.loads((out / "slurm" / "jobs.json").read_text())["aiperf"]
    assert f"aiperf job {job}" in submitted.stdout
    killed: list[int] = []
    kill_time: list[float] = []

    def kill() -> None:
        kill_time.append(time.time())
        killed.extend(kill_on_node("node02", b"aiperf"))

    timer = threading.Timer(KILL_AFTER_S, kill)
    timer.start()
    # sbatch --wait on a job that can start only once the AIPerf job has ended
    waited = vcluster.exec(
        "login",
        ["sbatch", "--wait", f"--dependency=afterany:{job}", f"--output={work}/wait.out", "--wrap=true"],
        check=False,
        timeout=MINUTES * 60 + 240,
    )
    timer.cancel()
    said = (out / "slurm" / f"aiperf-{job}.out").read_text()
    assert waited.returncode == 0, said[-3000:]
    assert killed, said[-3000:]  # node02's worker was running when it was killed
    assert "node02: task 1: Killed" in said, said[-3000:]

    score = json.loads((out / "slurm" / f"check-{job}.json").read_text())  # the job's own check
    assert score["valid"] and score["best_accuracy"] >= 0.6 and score["final"]["score"] > 0, said[-3000:]
    assert score["nodes"] == 2
    records = [
        json.loads(line)
        for log in (out / "aiperf").glob("trials/*/epochs.jsonl")
        for line in log.read_text().splitlines()
        if line.endswith("}")
    ]
    by_node = {node: [r for r in records if r["node"] == node] for node in ("node01", "node02")}
    assert by_node["node02"], "node02 logged no epoch before it was killed"
    assert max(r["time"] for r in by_node["node02"]) < kill_time[0]
    assert max(r["time"] for r in by_node["node01"]) > kill_time[0] + 5  # node01 went on
    assert score["epochs"] == len(records)  # node02's finished epochs count with node01's
