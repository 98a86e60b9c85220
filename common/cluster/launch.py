"""Where this process sits in a job, read from the launcher's environment (pure, no torch),
and which ranks share a node (`NodeLayout`, from every rank's host name).

Understood launchers: torchrun, mpirun (Open MPI, MPICH/Intel MPI PMI), srun, and a plain
single process.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mlhpc.common.errors import ConfigError

Launcher = Literal["torchrun", "mpi", "slurm", "single"]
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """The ranks and rendezvous point one process was started with."""

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


@dataclass(frozen=True)
class NodeLayout:
    """Which ranks share a node: every node's ranks, nodes in the order of their first rank, and
    this process's rank. Worked out once for a job (`node_layout`); the trainers' node groups
    and the staging communicator are both built from it."""

    nodes: tuple[tuple[int, ...], ...]
    rank: int

    def __post_init__(self) -> None:
        ranks = sorted(r for node in self.nodes for r in node)
        if ranks != list(range(len(ranks))) or self.rank not in ranks or not all(self.nodes):
            raise ValueError(f"nodes={self.nodes} rank={self.rank}: every rank 0..N-1 once, on a node")

    @property
    def node(self) -> int:
        """This rank's node index."""
        return next(i for i, ranks in enumerate(self.nodes) if self.rank in ranks)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def local_rank(self) -> int:
        return self.nodes[self.node].index(self.rank)

    @property
    def local_size(self) -> int:
        return len(self.nodes[self.node])

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.nodes)

    def each_rank_a_node(self) -> NodeLayout:
        """Every rank its own node (a one-machine stand-in for a cluster)."""
        return NodeLayout(tuple((r,) for r in range(self.world_size)), self.rank)

    def within(self, ranks: Sequence[int]) -> NodeLayout:
        """The layout of a sub-job of `ranks` (this rank among them), renumbered 0.. in their order."""
        number = {r: i for i, r in enumerate(ranks)}
        nodes = tuple(kept for node in self.nodes if (kept := tuple(number[r] for r in node if r in number)))
        return NodeLayout(nodes, number[self.rank])


def node_layout(hosts: Sequence[str], rank: int) -> NodeLayout:
    """The layout from every rank's host name (indexed by rank): ranks with one host share a node."""
    names = list(dict.fromkeys(hosts))  # nodes in the order of their first rank
    return NodeLayout(tuple(tuple(r for r, h in enumerate(hosts) if h == name) for name in names), rank)


def uniform_layout(rank: int, world_size: int, local_size: int) -> NodeLayout:
    """The layout when no host names were gathered (Horovod, a context made by hand): runs of
    `local_size` consecutive ranks, as launchers place them."""
    per = max(1, local_size)
    return NodeLayout(
        tuple(tuple(range(s, min(s + per, world_size))) for s in range(0, world_size, per)), rank
    )


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_OPEN_MPI_VARS = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
_PMI_VARS = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
_SLURM_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None)
"""Each launcher's rank, world size, local rank and local world size (srun: from its tasks per node)."""


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read the launcher's variables; torchrun wins, then MPI, then an srun step, else single."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env or {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= env.keys():
        return _from_vars(env, "torchrun", *_TORCHRUN_VARS, master="127.0.0.1")
    if "OMPI_COMM_WORLD_SIZE" in env:
        return _from_vars(env, "mpi", *_OPEN_MPI_VARS, master="127.0.0.1")
    if "PMI_SIZE" in env and "PMI_RANK" in env:
        return _from_vars(env, "mpi", *_PMI_VARS, master="127.0.0.1")
    # SLURM_STEP_NUM_TASKS exists only inside an srun step, not in the batch script itself.
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return _from_vars(
            env,
            "slurm",
            *_SLURM_VARS,
            master=first_slurm_host(env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))),
            local_size=slurm_tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", "")),
            default_port=DEFAULT_MASTER_PORT + int(env.get("SLURM_JOB_ID", "0")) % 1000,
        )
    return LaunchInfo(
        launcher="single",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)),
    )


def _from_vars(
    env: Mapping[str, str],
    launcher: Launcher,
    rank_key: str,
    size_key: str,
    local_rank_key: str,
    local_size_key: str | None,
    *,
    master: str,
    local_size: int | None = None,
    default_port: int = DEFAULT_MASTER_PORT,
) -> LaunchInfo:
    try:
        rank = int(env[rank_key])
        world_size = int(env[size_key])
        local_rank = int(env.get(local_rank_key, rank))
        if local_size is None:
            local_size = int(env[local_size_key]) if local_size_key and local_size_key in env else world_size
    except (KeyError, ValueError) as e:
        raise ConfigError(
            f"{launcher} launch: cannot read ranks from {rank_key}/{size_key} ({e}); "
            "check the launcher's environment"
        ) from e
    return LaunchInfo(
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_size,
        master_addr=env.get("MASTER_ADDR", master or "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", default_port)),
    )


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list, as `scontrol show hostnames` gives it:
    'n[003-005,9],gpu1' -> 'n003', and with several ranges in one name (multi-dimensional
    clusters) 'rack[1-2]-node[01-04]' -> 'rack1-node01'."""
    host, rest = "", nodelist.strip()
    while rest and not rest.startswith(","):
        if rest.startswith("["):
            ranges, closed, rest = rest[1:].partition("]")
            if not closed:
                break  # not a node list: keep what came before the bracket
            host += ranges.split(",")[0].split("-")[0]
        else:
            end = min((i for i in (rest.find(","), rest.find("[")) if i >= 0), default=len(rest))
            host, rest = host + rest[:end], rest[end:]
    return host or "127.0.0.1"


def slurm_tasks_on_first_node(tasks_per_node: str) -> int | None:
    """'2(x3),1' -> 2; the task count of the first node, None if unknown."""
    match = re.match(r"(\d+)", tasks_per_node.strip())
    return int(match.group(1)) if match else None


def host_label() -> str:
    """This node's short host name as it goes into a file name (characters other than
    [A-Za-z0-9._-] as _): power logs' node_<host>.txt, debug logs' debug-…-<host>-…."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname().split(".")[0]) or "node"
