"""The staging communicator over MPI (mpi4py), for jobs that mpirun or srun --mpi started.

Imported only when chosen; mpi4py is optional.
"""

from __future__ import annotations

import socket
from typing import Any

from mlhpc.common.cluster.launch import NodeLayout, node_layout, uniform_layout
from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import topology_of


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
