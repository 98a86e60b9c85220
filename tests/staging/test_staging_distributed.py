"""Staging over real 2-process groups (gloo, and MPI when installed), each rank its own node."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, build_manifest, verify_staged
from tests.helpers.cli import cli_env
from tests.helpers.datasets import dataset_files

pytestmark = pytest.mark.distributed

# Runs `tasks` (StageRequest keyword sets) one after another in the group; one report per rank.
STAGE_TASKS = """
import json, os, signal, sys
from pathlib import Path
from mlhpc.common.errors import StagingError
from mlhpc.staging import StageRequest, exchange, make_comm, stage_dataset

tasks = json.loads(Path(sys.argv[1]).read_text())
comm = make_comm(sys.argv[3], each_rank_a_node=True)
if len(sys.argv) > 4 and comm.rank == int(sys.argv[4]):  # this rank dies after writing 3 files
    record, count = exchange.StreamSinks._record, [0]
    def record_then_die(self, staged):
        record(self, staged)
        count[0] += 1
        if count[0] == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    exchange.StreamSinks._record = record_then_die
out = []
for task in tasks:
    dest = Path(task.pop("dest").replace("{node}", str(comm.topology.node)))
    try:
        r = stage_dataset(StageRequest(task.pop("src"), dest, **task), comm)
        out.append({"files": r.files, "copied": r.copied_files, "skipped": r.skipped_files,
                    "read": r.read_bytes, "job_read": r.job_read_bytes, "node": r.node, "nodes": r.num_nodes})
    except StagingError as e:
        out.append({"error": str(e)})
Path(sys.argv[2], f"rank{comm.rank}.json").write_text(json.dumps(out))
comm.close()
"""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for i in range(30):
        path = root / f"part{i % 3}" / f"s{i:02d}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(3000 * (i % 7) + 17 * i))
    (root / "empty.lst").write_bytes(b"")
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def run_group(
    tmp_path: Path, tasks: list[dict], comm: str = "torch", kill_rank: int | None = None
) -> tuple[subprocess.CompletedProcess[str], list[list[dict]]]:
    """Two ranks under torchrun (or mpirun), running `tasks`; their exit and their reports."""
    args, out = _prepare(tmp_path, tasks, comm, kill_rank)
    if comm == "mpi":
        launcher = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=300, env=cli_env())
    return proc, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def run_unsupervised(tmp_path: Path, tasks: list[dict], kill_rank: int) -> list[list[dict]]:
    """Two ranks started side by side, as srun does: when one dies, the other is not killed."""
    args, out = _prepare(tmp_path, tasks, "torch", kill_rank)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, *args],
            env=cli_env(
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            ),
        )
        for r in (0, 1)
    ]
    for rank in ranks:
        rank.wait(timeout=300)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _prepare(tmp_path: Path, tasks: list[dict], comm: str, kill_rank: int | None) -> tuple[list[str], Path]:
    script, plan, out = tmp_path / "stage_tasks.py", tmp_path / "tasks.json", tmp_path / "reports"
    script.write_text(STAGE_TASKS)
    plan.write_text(json.dumps(tasks))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return [str(script), str(plan), str(out), comm, *([str(kill_rank)] if kill_rank is not None else [])], out


def test_replicate_and_shard_over_two_gloo_ranks(dataset: Path, tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in dataset.rglob("*.npy"))
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(dataset, arcname=".")
    tasks = [
        {"src": str(dataset), "dest": str(tmp_path / "rep{node}"), "mode": "replicate", "chunk_bytes": 65536},
        {"src": str(dataset), "dest": str(tmp_path / "shard{node}"), "mode": "shard"},
        {"src": str(archive), "dest": str(tmp_path / "tar{node}"), "mode": "replicate", "chunk_bytes": 65536},
    ]
    proc, reports = run_group(tmp_path, tasks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rep0, shard0, tar0), (rep1, shard1, tar1) = reports
    # replicate: both nodes hold everything, and the source was read once in total, by both ranks
    assert rep0["nodes"] == rep1["nodes"] == 2 and {rep0["node"], rep1["node"]} == {0, 1}
    assert rep0["read"] > 0 and rep1["read"] > 0
    assert rep0["read"] + rep1["read"] == rep0["job_read"] == total
    for node in (0, 1):
        assert dataset_files(tmp_path / f"rep{node}") == dataset_files(dataset)
        assert verify_staged(tmp_path / f"rep{node}") == 31
    # shard: each node holds its own part; together exactly the dataset
    parts = [dataset_files(tmp_path / f"shard{node}") for node in (0, 1)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert {**parts[0], **parts[1]} == dataset_files(dataset)
    assert shard0["files"] + shard1["files"] == 31 and shard0["job_read"] == total
    # an archive replicated: read once in total (striped over the nodes), extracted on both
    assert tar0["read"] + tar1["read"] == tar0["job_read"] <= archive.stat().st_size
    assert tar0["read"] > 0 and tar1["read"] > 0
    assert dataset_files(tmp_path / "tar0") == dataset_files(tmp_path / "tar1") == dataset_files(dataset)


def test_missing_source_file_names_the_rank_and_file_on_every_rank(dataset: Path, tmp_path: Path) -> None:
    (dataset / "part1" / "s04.npy").unlink()
    tasks = [{"src": str(dataset), "dest": str(tmp_path / "n{node}"), "mode": "replicate"}]
    proc, reports = run_group(tmp_path, tasks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = [r[0].get("error", "") for r in reports]
    assert errors[0] == errors[1] and errors[0].startswith("rank ")
    assert "staging source file" in errors[0] and "s04.npy is missing; restore it" in errors[0]
    assert not (tmp_path / "n0" / STAGED_MARKER).exists() and not (tmp_path / "n1" / STAGED_MARKER).exists()


def test_a_rank_that_dies_leaves_nothing_marked_and_a_rerun_completes(dataset: Path, tmp_path: Path) -> None:
    tasks = [
        {"src": str(dataset), "dest": str(tmp_path / "n{node}"), "mode": "replicate", "chunk_bytes": 65536}
    ]
    reports = run_unsupervised(tmp_path, tasks, kill_rank=1)
    assert len(reports) == 1  # rank 1 was killed before it could report
    error = reports[0][0]["error"]
    assert re.fullmatch(
        rf"rank 0 on {re.escape(socket.gethostname())}: (staging exchange round \d+/\d+|a staging agreement) "
        rf"failed \(.+\): {re.escape(socket.gethostname())} \(rank 1\) stopped answering: .+; check "
        rf"{re.escape(socket.gethostname())}; nothing was marked staged, rerun to resume",
        error,
    ), error
    assert not (tmp_path / "n0" / STAGED_MARKER).exists() and not (tmp_path / "n1" / STAGED_MARKER).exists()
    proc, reports = run_group(tmp_path, tasks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert reports[1][0]["skipped"] >= 3  # what rank 1 staged before it died is kept
    for node in (0, 1):
        assert dataset_files(tmp_path / f"n{node}") == dataset_files(dataset)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (apt-get install openmpi-bin)")
def test_replicate_over_mpi(dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    tasks = [
        {"src": str(dataset), "dest": str(tmp_path / "n{node}"), "mode": "replicate", "chunk_bytes": 65536}
    ]
    proc, reports = run_group(tmp_path, tasks, comm="mpi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert reports[0][0]["job_read"] == sum(p.stat().st_size for p in dataset.rglob("*.npy"))
    for node in (0, 1):
        assert dataset_files(tmp_path / f"n{node}") == dataset_files(dataset)
