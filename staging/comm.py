"""The small communicator staging needs, and the ones without torch or MPI.

Implementations: `CallbackComm` (one node, a barrier callable: the original API), `TorchComm`
(`torch.distributed`, in torch_comm.py) and `MpiComm` (mpi4py, in mpi_comm.py); the last two
are imported only when used, so staging runs on a login node without either.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from mlhpc.common.errors import StagingError
from mlhpc.common.launch import LaunchInfo, detect_launch
from mlhpc.staging.plan import Topology

log = logging.getLogger(__name__)
CommKind = Literal["auto", "torch", "mpi"]


class Communicator(Protocol):
    """Collectives over all ranks, and a fixed-size all-gather within this rank's peer group
    (the ranks with the same local rank, one per node, ordered by node)."""

    rank: int
    size: int
    topology: Topology
    collective: bool
    """False when the collectives reach only this rank (a barrier-only group): then the ranks
    read the source themselves, agree on nothing and `replicate` over nodes becomes `copy`."""

    def barrier(self) -> None: ...

    def allgather(self, payload: bytes) -> list[bytes]:
        """Every rank's `payload`, indexed by rank."""
        ...

    def broadcast(self, payload: bytes | None, root: int = 0) -> bytes: ...

    def peer_allgather(self, chunk: memoryview, out: memoryview) -> None:
        """Concatenate the peers' equal-sized `chunk`s into `out` (len(chunk) x peers)."""
        ...

    def peer_rank(self, node: int) -> int:
        """The global rank of this rank's peer on `node`."""
        ...

    def close(self) -> None:
        """Release what this communicator set up itself (a process group it initialised)."""
        ...


class CallbackComm:
    """Ranks of one node synchronised by a barrier callable; nothing is exchanged between them."""

    collective = False

    def __init__(
        self,
        local_rank: int = 0,
        local_size: int = 1,
        barrier: Callable[[], None] = lambda: None,
        *,
        node: int = 0,
        num_nodes: int = 1,
    ) -> None:
        self.topology = Topology(node=node, num_nodes=num_nodes, local_rank=local_rank, local_size=local_size)
        self.rank = node * local_size + local_rank
        self.size = num_nodes * local_size
        self._barrier = barrier

    def barrier(self) -> None:
        self._barrier()

    def allgather(self, payload: bytes) -> list[bytes]:
        self._barrier()  # a synchronisation point like a real all-gather, but it sees only this rank
        return [payload]

    def broadcast(self, payload: bytes | None, root: int = 0) -> bytes:
        if payload is None:
            raise StagingError("a barrier-only group cannot broadcast; pass a Communicator")
        return payload

    def peer_allgather(self, chunk: memoryview, out: memoryview) -> None:
        raise StagingError("a barrier-only group cannot exchange data; pass a Communicator")

    def peer_rank(self, node: int) -> int:
        return node * self.topology.local_size + self.topology.local_rank

    def close(self) -> None:
        pass


def topology_from_hosts(
    hosts: Sequence[str], rank: int, each_rank_a_node: bool = False
) -> tuple[Topology, list[list[int]]]:
    """This rank's topology from every rank's host name, and the peer groups (ranks by node).

    `each_rank_a_node` makes every rank its own node (a one-machine stand-in for a cluster,
    each rank with its own directory).
    """
    if each_rank_a_node:
        hosts = [f"rank{r}" for r in range(len(hosts))]
    names = sorted(set(hosts), key=hosts.index)  # nodes in order of their first rank
    members = [[r for r, h in enumerate(hosts) if h == name] for name in names]
    node = names.index(hosts[rank])
    local = members[node]
    exchange_ranks = min(len(m) for m in members)
    topo = Topology(
        node=node,
        num_nodes=len(names),
        local_rank=local.index(rank),
        local_size=len(local),
        exchange_ranks=exchange_ranks,
    )
    peers = [[m[i] for m in members] for i in range(exchange_ranks)]
    return topo, peers


def make_comm(
    kind: CommKind = "auto", *, each_rank_a_node: bool = False, launch: LaunchInfo | None = None
) -> Communicator:
    """The communicator for a `mlhpc stage` process: none for one process, MPI when that is the
    launcher and mpi4py is installed, else torch.distributed (gloo)."""
    launch = launch or detect_launch()
    if launch.world_size == 1 and kind == "auto":
        return CallbackComm()
    if kind == "mpi" or (kind == "auto" and launch.launcher == "mpi" and mpi_available()):
        from mlhpc.staging.mpi_comm import MpiComm

        return MpiComm(each_rank_a_node=each_rank_a_node)
    from mlhpc.staging.torch_comm import TorchComm

    return TorchComm.launch(launch, each_rank_a_node=each_rank_a_node)


def mpi_available() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def host_name() -> str:
    return socket.gethostname()


class LostRankError(StagingError):
    """A collective failed: another rank died or was killed, so the ranks cannot agree any more."""


def agree(comm: Communicator, error: str | None, value: Any = None) -> list[Any]:
    """All-gather (error, value) from every rank; raise the first error on every rank, naming
    the rank it came from."""
    try:
        payloads = comm.allgather(json.dumps([error, value]).encode())
    except StagingError:
        raise
    except Exception as e:
        raise lost_peer(comm, "a staging agreement", e) from e
    gathered = [json.loads(p) for p in payloads]
    for rank, (other_error, _) in enumerate(gathered):
        if other_error:
            named = len(gathered) > 1 and not other_error.startswith("rank ")
            raise StagingError(f"rank {rank}: {other_error}" if named else other_error)
    return [value for _, value in gathered]


def lost_peer(comm: Communicator, what: str, error: BaseException) -> LostRankError:
    """The error for a collective that failed because another rank died or was killed."""
    reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return LostRankError(
        f"rank {comm.rank}: {what} failed ({reason}): another rank died or was killed; "
        "nothing was marked staged, rerun to resume"
    )
