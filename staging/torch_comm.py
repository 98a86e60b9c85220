"""The staging communicator over torch.distributed (gloo on CPU, NCCL on GPU).

Imported only when a torch process group is used, so `mlhpc.staging` stays torch-free.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from mlhpc.common.cluster.distributed import gather_node_layout
from mlhpc.common.cluster.group import join_group, lost_ranks, shutdown_distributed
from mlhpc.common.cluster.launch import LaunchInfo, NodeLayout, uniform_layout
from mlhpc.staging.comm import topology_of


class TorchComm:
    """World collectives on the default group; one extra group per local rank for the exchange.

    Every rank must construct it at the same point (it creates process groups). `layout`: the
    job's node layout when the run has it already (`DistContext.layout`); None gathers it.
    """

    collective = True

    def __init__(
        self, layout: NodeLayout | None = None, *, owns_group: bool = False, own_groups: bool = False
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("TorchComm needs an initialised torch.distributed default group")
        self._owns_group = owns_group
        # A staging that runs beside training (--staging overlap) has gloo groups of its own: two
        # threads' collectives on one group would pair up wrongly across the ranks.
        self._world: Any = dist.new_group(backend="gloo") if own_groups else None
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        layout = layout or gather_node_layout(self.rank)
        assert (layout.rank, layout.world_size) == (self.rank, self.size), "a layout of another group"
        self.topology, peers = topology_of(layout)
        self._peers: list[int] = []
        self._group: Any = None
        for ranks in peers:  # every rank creates every group, in the same order
            if len(ranks) == self.size:
                group = self._world
            else:
                group = dist.new_group(ranks, backend="gloo" if own_groups else None)
            if self.rank in ranks:
                self._peers, self._group = ranks, group
        self._device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl" and not own_groups
            else torch.device("cpu")
        )

    @classmethod
    def launch(cls, launch: LaunchInfo, *, each_rank_a_node: bool = False) -> TorchComm:
        """Join (or reuse) a gloo group from the launcher's environment, as `mlhpc stage` does."""
        owns = not dist.is_initialized()
        if owns:  # every collective times out after MLHPC_COLLECTIVE_TIMEOUT (600 s)
            join_group("gloo", launch.master_addr, launch.master_port, launch.rank, launch.world_size)
        layout = uniform_layout(dist.get_rank(), dist.get_world_size(), 1) if each_rank_a_node else None
        return cls(layout, owns_group=owns)

    def barrier(self) -> None:
        dist.barrier(group=self._world)

    def allgather(self, payload: bytes) -> list[bytes]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, payload, group=self._world)
        return out

    def broadcast(self, payload: bytes | None, root: int = 0) -> bytes:
        box = [payload]
        dist.broadcast_object_list(box, src=root, group=self._world)
        return box[0]

    def peer_allgather(self, chunk: memoryview, out: memoryview) -> None:
        source = torch.frombuffer(chunk, dtype=torch.uint8)
        target = torch.frombuffer(out, dtype=torch.uint8)
        if self._device.type == "cuda":  # NCCL moves device memory: stage through the GPU
            on_device = torch.empty(len(out), dtype=torch.uint8, device=self._device)
            dist.all_gather_single(on_device, source.to(self._device), group=self._group)
            target.copy_(on_device.cpu())
        else:
            dist.all_gather_single(target, source, group=self._group)

    def peer_rank(self, node: int) -> int:
        return self._peers[node]

    def lost(self) -> str | None:
        """After a collective failed: the node(s) that stopped answering, as words for one line."""
        silence = lost_ranks()
        return silence.words() if silence is not None else None

    def close(self) -> None:
        """Destroy the process group if `launch` created it (leaving it to exit can abort)."""
        if self._owns_group:
            shutdown_distributed()
