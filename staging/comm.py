"""The small communicator staging needs, the one without torch or MPI, and the agreement
helpers every rank runs.

Implementations: `CallbackComm` (one node, a barrier callable: the original API), `TorchComm`
(`torch.distributed`, in torch_comm.py) and `MpiComm` (mpi4py, imported when one is made);
connect.py picks one, so staging runs on a login node without torch or MPI.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any, Protocol

from mlhpc.common.cluster.launch import NodeLayout, node_layout, uniform_layout
from mlhpc.common.errors import StagingError
from mlhpc.staging.plan import Topology

log = logging.getLogger(__name__)


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


def topology_of(layout: NodeLayout) -> tuple[Topology, list[list[int]]]:
    """This rank's staging topology and the peer groups: for each local rank that takes part in
    the exchange (as many as the smallest node has), that local rank's global rank on every node."""
    exchange_ranks = min(len(ranks) for ranks in layout.nodes)
    topo = Topology(
        node=layout.node,
        num_nodes=layout.num_nodes,
        local_rank=layout.local_rank,
        local_size=layout.local_size,
        exchange_ranks=exchange_ranks,
    )
    peers = [[ranks[i] for ranks in layout.nodes] for i in range(exchange_ranks)]
    return topo, peers


def mpi_available() -> bool:
    """Whether mpi4py is installed (imported here, not initialised)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


class MpiComm:
    """World collectives on COMM_WORLD; the peer group is a split of it by local rank.

    `layout`: the job's node layout when the run has it already (its ranks are COMM_WORLD's);
    None gathers the host names over MPI."""

    collective = True

    def __init__(self, layout: NodeLayout | None = None, *, each_rank_a_node: bool = False) -> None:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise StagingError(
                "MPI staging needs mpi4py: `pip install mpi4py` (after the MPI development "
                "package, e.g. apt-get install libopenmpi-dev), or stage over torch.distributed"
            ) from e
        self._mpi: Any = MPI
        self._world: Any = MPI.COMM_WORLD
        self.rank = self._world.Get_rank()
        self.size = self._world.Get_size()
        if each_rank_a_node:
            layout = uniform_layout(self.rank, self.size, 1)
        elif layout is None:
            layout = node_layout(self._world.allgather(socket.gethostname()), self.rank)
        if (layout.rank, layout.world_size) != (self.rank, self.size):
            raise StagingError(
                f"MPI rank {self.rank} of {self.size} is rank {layout.rank} of {layout.world_size} in the "
                "torch.distributed group: launch with mpirun alone, or stage with --comm torch"
            )
        self.topology, peers = topology_of(layout)
        self._peers = next((ranks for ranks in peers if self.rank in ranks), [])
        color = self.topology.local_rank if self._peers else MPI.UNDEFINED
        self._group: Any = self._world.Split(color, key=self.topology.node)

    def barrier(self) -> None:
        self._world.Barrier()

    def allgather(self, payload: bytes) -> list[bytes]:
        return self._world.allgather(payload)

    def broadcast(self, payload: bytes | None, root: int = 0) -> bytes:
        return self._world.bcast(payload, root=root)

    def peer_allgather(self, chunk: memoryview, out: memoryview) -> None:
        self._group.Allgather(chunk, out)

    def peer_rank(self, node: int) -> int:
        return self._peers[node]

    def close(self) -> None:
        if self._group is not None and self._group != self._mpi.COMM_NULL:
            self._group.Free()
        self._group = None


class LostRankError(StagingError):
    """A collective failed: another rank died or was killed, so the ranks cannot agree any more."""


def rank_label(comm: Communicator) -> str:
    """"rank 3 on node04": this rank, and the node to look at when its line is an error."""
    return f"rank {comm.rank} on {socket.gethostname()}"


def agree(comm: Communicator, error: str | None, value: Any = None) -> list[Any]:
    """All-gather (error, value) from every rank; raise the first error on every rank, naming
    the rank and the node it came from."""
    if error and comm.collective and comm.size > 1 and not error.startswith("rank "):
        error = f"{rank_label(comm)}: {error}"
    try:
        payloads = comm.allgather(json.dumps([error, value]).encode())
    except StagingError:
        raise
    except Exception as e:
        raise lost_peer(comm, "a staging agreement", e) from e
    gathered = [json.loads(p) for p in payloads]
    for other_error, _ in gathered:
        if other_error:
            raise StagingError(other_error)
    return [value for _, value in gathered]


def lost_peer(comm: Communicator, what: str, error: BaseException) -> LostRankError:
    """The error for a collective that failed because another rank died, was killed or lost its
    link: the node that stopped answering, when the communicator can tell (`lost()`)."""
    text = " ".join(str(error).split())
    if text.startswith("[") and "] " in text:  # gloo's source location
        text = text.split("] ", 1)[1]
    reason = text.split(". ", 1)[0].rstrip(".")[:200] or type(error).__name__
    lost = getattr(comm, "lost", None)
    who = (lost() if lost is not None else None) or "another rank died or was killed"
    return LostRankError(
        f"{rank_label(comm)}: {what} failed ({reason}): {who}; "
        "nothing was marked staged, rerun to resume"
    )
