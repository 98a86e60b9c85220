"""AIPerf across two hosts of the session's virtual cluster (scripts/vcluster): `srun -N 2 mlhpc run
aiperf --config mini`, one trial a node, the nodes sharing the search through the study's journal
file in the cluster's shared folder. Partway through, node02's trial process is killed (SIGKILL):
node01 goes on to the deadline, node02's finished epochs still count, and `mlhpc check` scores the
run, valid at the mini config's own threshold.

The client (srun) runs on `login`, never in the host's own network namespace; the kill is of the
processes whose environment says they run on node02 (the hosts share the machine's process table).
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


def test_two_nodes_search_a_lost_node_loses_only_its_trial_and_the_run_is_valid(
    vcluster: VCluster, work: Path
) -> None:
    data, out = work / "data", work / "out"
    vcluster.exec("login", ["mlhpc", "generate", "aiperf", "--config", "mini", "--out", str(data)], timeout=120)
    killed: list[int] = []
    kill_time: list[float] = []

    def kill() -> None:
        kill_time.append(time.time())
        killed.extend(kill_on_node("node02", b"aiperf"))

    timer = threading.Timer(KILL_AFTER_S, kill)
    timer.start()
    srun = ["srun", "-N", "2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--no-kill"]
    command = ["mlhpc", "run", "aiperf", "--config", "mini", "--data", str(data), "--out", str(out),
               "--no-check", f"search.duration_minutes={MINUTES}"]
    proc = vcluster.exec("login", [*srun, *command], cwd=work, check=False, timeout=MINUTES * 60 + 240)
    timer.cancel()
    assert killed, proc.stderr[-2000:]  # node02's worker was running when it was killed
    assert "node02: task 1: Killed" in proc.stderr, proc.stderr[-2000:]

    report = work / "score.json"
    checked = vcluster.exec("login", ["mlhpc", "check", str(out), "--json", str(report)], check=False)
    assert checked.returncode == 0, (checked.stdout[-2000:], checked.stderr[-2000:])
    score = json.loads(report.read_text())
    assert score["valid"] and score["best_accuracy"] >= 0.6 and score["final"]["score"] > 0

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
