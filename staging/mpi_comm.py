"""The staging communicator over MPI (mpi4py), for jobs that mpirun or srun --mpi started.

Imported only when chosen; mpi4py is optional.
"""

from __future__ import annotations

from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import host_name, topology_from_hosts


class MpiComm:
    """World collectives on COMM_WORLD; the peer group is a split of it by local rank."""

    collective = True

    def __init__(self, *, each_rank_a_node: bool = False) -> None:
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
        hosts = self._world.allgather(host_name())
        self.topology, peers = topology_from_hosts(hosts, self.rank, each_rank_a_node)
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
