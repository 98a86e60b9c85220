"""A weak-scaling instance's place on the nodes (`DistContext.split`) comes from the ranks' host
names, not from runs of `local_world_size`: under `srun --distribution=cyclic` an instance of
two consecutive ranks spans two nodes, and each of its ranks is local rank 0 of its node there.
tests/cluster/test_cluster_training.py runs the same on real hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env

# Two ranks of one real gloo group on this host, each given the layout that gather_node_layout
# finds when they sit on two hosts ("a" and "b"), then one instance of both.
RANKS = """
import json, sys
from pathlib import Path
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
from mlhpc.common.cluster.launch import node_layout
ctx = init_distributed("auto", "cpu")
same = ctx.split(1)
ctx.layout = node_layout(["a", "b"], ctx.rank)
apart = ctx.split(1)
report = {name: [c.num_nodes, c.local_rank, c.local_world_size, c.layout.nodes]
          for name, c in (("same", same), ("apart", apart))}
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(report))
shutdown_distributed()
"""


@pytest.mark.distributed
def test_an_instance_counts_its_nodes_from_host_names(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*launcher, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # one host: one node of two ranks
    assert [r["same"] for r in reports] == [[1, 0, 2, [[0, 1]]], [1, 1, 2, [[0, 1]]]]
    # two hosts: two nodes, each rank alone on its node (so each stages and cleans up its node)
    assert [r["apart"] for r in reports] == [[2, 0, 1, [[0], [1]]], [2, 0, 1, [[0], [1]]]]
