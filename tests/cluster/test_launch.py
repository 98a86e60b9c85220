"""Launcher detection: torchrun, mpirun (Open MPI and PMI), srun steps, and a plain process."""

from __future__ import annotations

from pathlib import Path

from mlhpc.common.cluster.launch import LaunchInfo, detect_launch, first_slurm_host, slurm_tasks_on_first_node
from mlhpc.staging import resolve_local_dir


def node_rank(info: LaunchInfo) -> int:
    """The node index when ranks fill nodes in order (what torchrun and block srun do)."""
    return info.rank // max(1, info.local_world_size)


def test_single_process() -> None:
    info = detect_launch({})
    assert (info.launcher, info.rank, info.world_size, info.num_nodes) == ("single", 0, 1, 1)


def test_torchrun() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node7",
        "MASTER_PORT": "1234",
        "TORCHELASTIC_RUN_ID": "x",
    }
    info = detect_launch(env)
    assert info.launcher == "torchrun"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 4)
    assert (info.num_nodes, node_rank(info), info.master_addr, info.master_port) == (2, 1, "node7", 1234)


def test_open_mpi() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        # mpirun inside a Slurm allocation still carries the batch step's variables
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "4",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.num_nodes) == ("mpi", 3, 4, 1, 2)


def test_mpich_pmi() -> None:
    info = detect_launch({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"})
    assert (info.launcher, info.rank, info.world_size, info.local_world_size) == ("mpi", 2, 3, 3)


def test_srun_step() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "12345",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("slurm", 3, 4, 1)
    assert (info.local_world_size, info.num_nodes, node_rank(info)) == (2, 2, 1)
    assert info.master_addr == "gpu07"
    assert info.master_port == 29500 + 345


def test_sbatch_script_outside_srun_is_single() -> None:
    # The batch script itself has SLURM_PROCID=0 and SLURM_NTASKS but is one process.
    assert detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}).launcher == "single"


def test_slurm_parsers() -> None:
    assert first_slurm_host("n[003-005,9],gpu1") == "n003"
    assert first_slurm_host("rack[1-2]-node[01-04],x") == "rack1-node01"  # tests/test_cluster_training
    assert first_slurm_host("login1") == "login1"
    assert first_slurm_host("") == "127.0.0.1"
    assert slurm_tasks_on_first_node("2(x3),1") == 2
    assert slurm_tasks_on_first_node("") is None


def test_local_dir_precedence(tmp_path: Path) -> None:
    assert resolve_local_dir(tmp_path / "flag", {"MLHPC_LOCAL_DIR": "/a"}) == tmp_path / "flag"
    assert resolve_local_dir(None, {"MLHPC_LOCAL_DIR": "/a", "SLURM_TMPDIR": "/b"}) == Path("/a")
    assert resolve_local_dir(None, {"SLURM_TMPDIR": "/b", "TMPDIR": "/c"}) == Path("/b")
