"""Real 2-process gloo groups: the collectives, node-local staging and a data-parallel run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.launchers import torchrun

pytestmark = pytest.mark.distributed

COLLECTIVES = """
import json, sys, torch
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
ctx = init_distributed("gloo", "cpu")
total = ctx.all_reduce_sum(torch.tensor([float(ctx.rank + 1)]))
word = ctx.broadcast_object("from-rank-0" if ctx.rank == 0 else None)
ctx.node_barrier()
report = json.dumps({"rank": ctx.rank, "world": ctx.world_size, "local": ctx.local_world_size,
                  "nodes": ctx.num_nodes, "sum": total.item(), "word": word, "launcher": ctx.launcher})
# One file per rank: two ranks printing at once can interleave their lines on stdout.
open(f"{sys.argv[1]}/rank{ctx.rank}.json", "w").write(report)
shutdown_distributed()
"""




def test_collectives_over_two_ranks(tmp_path: Path) -> None:
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    proc = torchrun([str(script), str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["world"] == 2 and report["local"] == 2 and report["nodes"] == 1
        assert report["sum"] == 3.0 and report["word"] == "from-rank-0" and report["launcher"] == "torchrun"


@pytest.mark.slow
def test_two_rank_data_parallel_run(cosmo_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = torchrun(
        [
            "-m",
            "mlhpc",
            "run",
            "cosmoflow",
            "--seeds",
            "1",
            "--first-seed",
            "4",
            "--out",
            str(out),
            "--system",
            "ci_cpu_n2",
            "--backend",
            "gloo",
            "--no-check",
            "--mllog-stdout",
            "loop.global_batch_size=8",
            "data.num_train_samples=1024",
            "data.num_eval_samples=128",
        ],
        tmp_path,
        MLHPC_LOCAL_DIR=str(tmp_path / "local"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list(out.rglob("result_*.txt"))
    assert [p.name for p in results] == ["result_0.txt"]  # rank 0 alone writes
    events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in results[0].read_text().splitlines()]
    by_key = {e["key"]: e for e in events}
    assert by_key["run_stop"]["metadata"]["status"] == "success"
    assert by_key["global_batch_size"]["value"] == 8
    assert by_key["train_samples"]["value"] == 1024
    # Both ranks staged half of the files each into one node-local copy, removed after the run.
    assert by_key["staging_stop"]["metadata"]["staged_files"] == 1024 * 2 + 128 * 2 + 4
    assert not list((tmp_path / "local").glob("mlhpc-stage-*"))
    assert proc.stdout.count(":::MLLOG") == len(events)  # rank 1 prints nothing
    epochs = [e for e in events if e["key"] == "epoch_start"]
    # one line an epoch; a slow epoch adds "still training" heartbeats, which are not epoch lines
    said = [line for line in proc.stdout.splitlines() if line.startswith("epoch ") and "still training" not in line]
    assert len(said) == len(epochs)
