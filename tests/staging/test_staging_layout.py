"""Which ranks share a node, worked out once (`common.cluster.launch.node_layout`), and the staging
communicator built from it: from host names, for a sub-job, and from a real run's DistContext."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.common.cluster.launch import NodeLayout, node_layout, uniform_layout
from mlhpc.staging import CallbackComm, comm_for
from mlhpc.staging.comm import topology_of
from tests.helpers.cli import cli_env


def test_ranks_on_one_host_share_a_node_in_the_order_of_their_first_rank() -> None:
    hosts = ["b", "b", "a", "c", "a", "b"]
    layout = node_layout(hosts, 4)
    assert layout.nodes == ((0, 1, 5), (2, 4), (3,))
    assert (layout.node, layout.num_nodes, layout.local_rank, layout.local_size) == (1, 3, 1, 2)
    topo, peers = topology_of(layout)
    assert (topo.node, topo.num_nodes, topo.local_rank, topo.local_size, topo.exchange_ranks) == (
        1,
        3,
        1,
        2,
        1,
    )
    assert peers == [[0, 2, 3]]  # local rank 0 of every node; the smallest node has one rank


def test_a_sub_job_keeps_its_ranks_nodes_renumbered() -> None:
    layout = node_layout(["n0", "n0", "n1", "n1", "n2", "n2"], 3)
    second = layout.within(range(2, 6))
    assert second.nodes == ((0, 1), (2, 3)) and (second.rank, second.node, second.local_rank) == (1, 0, 1)
    halves = layout.within(range(3, 6))  # an instance that starts mid-node
    assert halves.nodes == ((0,), (1, 2)) and (halves.node, halves.num_nodes) == (0, 2)


def test_uniform_layout_is_runs_of_consecutive_ranks() -> None:
    assert uniform_layout(5, 6, 4).nodes == ((0, 1, 2, 3), (4, 5))
    assert uniform_layout(2, 3, 1).nodes == ((0,), (1,), (2,))  # each rank a node
    with pytest.raises(ValueError, match="every rank"):
        NodeLayout(((0, 2),), 0)


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=24), st.data())
def test_every_rank_sees_the_same_nodes_and_its_own_place(hosts: list[str], data: st.DataObject) -> None:
    layouts = [node_layout(hosts, r) for r in range(len(hosts))]
    assert len({layout.nodes for layout in layouts}) == 1
    assert layouts[0].num_nodes == len(set(hosts))
    for rank, layout in enumerate(layouts):
        assert layout.nodes[layout.node][layout.local_rank] == rank
        assert all(hosts[r] == hosts[rank] for r in layout.nodes[layout.node])
    start = data.draw(st.integers(0, len(hosts) - 1))
    rank = data.draw(st.integers(start, len(hosts) - 1))
    sub = layouts[rank].within(range(start, len(hosts)))
    assert sub.world_size == len(hosts) - start and sub.rank == rank - start


def test_one_process_gets_the_barrier_only_comm() -> None:
    from mlhpc.common.cluster.distributed import init_distributed

    comm = comm_for(init_distributed("auto", "cpu"))
    assert isinstance(comm, CallbackComm) and (comm.rank, comm.size) == (0, 1)


def test_a_horovod_rank_gets_barriers_on_runs_of_its_local_size() -> None:
    """Horovod gathers no host names: its ranks sit in runs of `local_world_size` (rank 3 of 4,
    two a node: node 1, local rank 1), and staging only synchronises them."""
    import torch

    from mlhpc.common.cluster.distributed import DistContext

    ctx = DistContext(
        rank=3,
        local_rank=1,
        world_size=4,
        local_world_size=2,
        num_nodes=2,
        device=torch.device("cpu"),
        backend="horovod",
        launcher="horovod",
    )
    comm = comm_for(ctx)
    assert isinstance(comm, CallbackComm) and not comm.collective
    assert (comm.rank, comm.size, comm.topology.node, comm.topology.local_rank) == (3, 4, 1, 1)


# Two ranks of one run: the staging communicator of the whole job (torch.distributed, on the
# layout the context gathered) and of one instance of a weak-scaling job (barriers only).
RUN_RANKS = """
import json, sys
from pathlib import Path
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
from mlhpc.staging import comm_for
ctx = init_distributed("auto", "cpu")
whole = comm_for(ctx)
instance = comm_for(ctx.split(2))
report = {"nodes": ctx.layout.nodes, "num_nodes": ctx.num_nodes,
          "whole": [type(whole).__name__, whole.rank, whole.size, whole.topology.num_nodes,
                    whole.topology.local_size, json.loads(whole.allgather(b'"x"')[1])],
          "instance": [type(instance).__name__, instance.rank, instance.size, instance.topology.num_nodes]}
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(report))
shutdown_distributed()
"""


@pytest.mark.distributed
def test_a_runs_staging_comm_is_built_from_its_context(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RUN_RANKS)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*launcher, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, env=cli_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(reports):
        assert report["nodes"] == [[0, 1]] and report["num_nodes"] == 1  # one host: one node
        assert report["whole"] == ["TorchComm", rank, 2, 1, 2, "x"]
        assert report["instance"] == ["CallbackComm", 0, 1, 1]


def launched(kind: str) -> list[str]:
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable]


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["torchrun", "mpirun"])
def test_mlhpc_stage_alone_works_the_node_layout_out_itself(kind: str, tmp_path: Path) -> None:
    """`mlhpc stage` under a launcher, with no run around it: two ranks on this host are one node,
    which gets the whole dataset once (torch.distributed under torchrun, MPI under mpirun)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    for i in range(12):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i}.bin").write_bytes(bytes([i]) * (1000 * i + 1))
    command = [*launched(kind), "-m", "mlhpc", "stage", str(src), str(dest)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "staged 12 files" in proc.stdout and "1 node(s)" in proc.stdout, proc.stdout
    assert main(["verify", str(dest)]) == 0
