"""A node's ranks: AIPerf runs one trial a node, data parallel over the node's ranks only.

Each node's ranks join a process group of their own (its rendezvous on the node's loopback, or the
launch's own when the launch is this one node), never one spanning nodes: a node that is lost
takes its own trial with it and no other node's collectives, and the nodes coordinate only
through the study's journal file.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mlhpc.benchmarks.aiperf.experiment import node_from_env
from mlhpc.common.cluster.group import join_group, shutdown_distributed
from mlhpc.common.cluster.launch import LaunchInfo, detect_launch

NODE_PORT_OFFSET = 17
"""The node group's port when the launch spans nodes: the launch's master port plus this, on the
node's own loopback (srun's master port is mlhpc's, below the ephemeral range, and so is this)."""


@dataclass(frozen=True)
class NodeGroup:
    """This process's place on its node, and the node's place in the run."""

    node: int
    nodes: int
    rank: int
    """Rank within the node (0 leads: asks the study, writes the logs)."""
    size: int
    device: torch.device
    host: str

    @property
    def leads(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def broadcast(self, value: Any) -> Any:
        """The node leader's `value` on every rank of the node."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the node's ranks."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (e.g. the deadline seen by one rank first)."""
        return self.sum([1.0 if flag else 0.0])[0] > 0 if self.distributed else flag

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def join_node(device: str = "auto", launch: LaunchInfo | None = None) -> NodeGroup:
    """This process's NodeGroup; with several ranks on the node, their own process group joined."""
    launch = launch or detect_launch()
    instance = node_from_env()
    local_size = max(1, launch.local_world_size)
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    dev = torch.device("cuda", launch.local_rank % max(torch.cuda.device_count(), 1)) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    backend = "nccl" if cuda else "gloo"
    if local_size > 1 and launch.world_size == local_size:
        # The launch is this one node (torchrun --standalone, srun on one node): its own rendezvous,
        # torchrun's store or rank 0's at the port the launcher chose. A second port derived from
        # it (below) may be any socket's on a busy machine: torchrun picks an ephemeral port.
        join_group(backend, launch.master_addr, launch.master_port, launch.rank, local_size, local_size)
    elif local_size > 1:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{launch.master_port + NODE_PORT_OFFSET}",
            rank=launch.local_rank,
            world_size=local_size,
            timeout=datetime.timedelta(minutes=10),
        )
    return NodeGroup(
        node=instance[0] if instance else launch.rank // local_size,
        nodes=instance[1] if instance else launch.num_nodes,
        rank=launch.local_rank,
        size=local_size,
        device=dev,
        host=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
    )


def leave_node(group: NodeGroup) -> None:
    if group.distributed:
        shutdown_distributed()  # the heartbeat join_group started, if any, then the group
