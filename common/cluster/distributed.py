"""One `init_distributed()` for every launcher, and the small `DistContext` passed around.

torch.distributed (gloo on CPU, NCCL on GPU) is the default; Horovod is an optional backend
behind the same interface, imported only when chosen.
"""

from __future__ import annotations

import inspect
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from mlhpc.common.cluster.allocator import keep_freed_memory
from mlhpc.common.cluster.group import join_group
from mlhpc.common.cluster.launch import LaunchInfo, NodeLayout, detect_launch, node_layout, uniform_layout
from mlhpc.common.cluster.threads import ThreadChoice, configure_threads
from mlhpc.common.errors import ConfigError

Backend = Literal["auto", "gloo", "nccl", "horovod"]



@dataclass(kw_only=True)
class DistContext:
    """This process's place in the job and the collectives the trainers need."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    num_nodes: int
    device: torch.device
    backend: str
    launcher: str
    node_group: Any = None
    group: Any = None
    """The process group of this context's collectives (None: the whole job)."""
    instance: int | None = None
    """Which model instance this rank trains in a weak-scaling job (None: one model)."""
    layout: NodeLayout | None = None
    """Which ranks share a node, from their host names (None: not gathered; see `node_layout`)."""
    threads: ThreadChoice | None = None
    """The CPU threads this rank's torch runs with, and why (common/cluster/threads)."""
    allocator: str | None = None
    """How this rank's host memory allocator treats freed memory, on a CPU (common/cluster/allocator)."""
    _hvd: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def node_layout(self) -> NodeLayout:
        """Which ranks share a node: as gathered at init, else runs of `local_world_size` ranks."""
        return self.layout or uniform_layout(self.rank, self.world_size, self.local_world_size)

    def barrier(self) -> None:
        if not self.distributed:
            return
        if self._hvd is not None:
            self._hvd.allreduce(torch.zeros(1), name="barrier")
        else:
            dist.barrier(group=self.group)

    def node_barrier(self) -> None:
        """Wait for the ranks of this node (all ranks under Horovod, which has no node groups)."""
        if not self.distributed:
            return
        if self._hvd is not None or self.node_group is None:
            self.barrier()
        else:
            dist.barrier(group=self.node_group)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over all ranks, in place, and return it."""
        if not self.distributed:
            return tensor
        if self._hvd is not None:
            tensor.copy_(self._hvd.allreduce(tensor, op=self._hvd.Sum))
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Elementwise maximum of `tensor` over all ranks, in place, and return it."""
        if not self.distributed:
            return tensor
        if self._hvd is not None:
            tensor.copy_(self._hvd.allreduce(tensor, op=self._hvd.Max))
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        if self._hvd is not None:
            # A fixed name: Horovod's default is the object's type, which differs between the
            # root's object and the others' placeholders (None), and the ranks then wait forever.
            return self._hvd.broadcast_object(obj, root_rank=src, name="mlhpc.broadcast_object")
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable, on the CPU), in rank order, over exactly this context's
        ranks: one model instance's group in a weak-scaling job, Horovod's ranks through its own
        allgather. One collective whatever the size of `obj`, so ranks holding different numbers
        of validation samples still issue the same collectives."""
        if not self.distributed:
            return [obj]
        if self._hvd is not None:
            return list(self._hvd.allgather_object(obj, name="mlhpc.all_gather_object"))
        parts: list[Any] = [None] * self.world_size
        # NCCL pickles through tensors on the current CUDA device (_pick_device set it).
        dist.all_gather_object(parts, obj, group=self.group)
        return parts

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Data-parallel wrapper for the backend (DDP; Horovod wraps the optimizer instead)."""
        if not self.distributed or self._hvd is not None:
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # No buffer broadcast from rank 0 before every forward (a collective per step): each rank
        # keeps its own batch-norm statistics, averaged before each evaluation, as the DeepCAM
        # reference does (average_batchnorm_statistics). torch 2.14 renamed the switch.
        ddp = torch.nn.parallel.DistributedDataParallel
        no_forward_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters
            else {"broadcast_buffers": False}
        )
        return ddp(model, device_ids=device_ids, process_group=self.group, **no_forward_sync)

    def split(self, instances: int) -> DistContext:
        """This rank's share of a weak-scaling job: `instances` groups of consecutive ranks, each
        training its own model. Every rank must call it (each creates every group, in order)."""
        if instances < 1 or self.world_size % instances:
            raise ConfigError(
                f"--instances {instances} does not divide the {self.world_size} rank(s); "
                f"launch a multiple of {instances} ranks"
            )
        if self._hvd is not None and instances > 1:
            raise ConfigError("--instances needs torch.distributed; use --backend auto, not horovod")
        size = self.world_size // instances
        instance = self.rank // size
        group = None
        if self.distributed and size > 1:
            groups = [dist.new_group(list(range(i * size, (i + 1) * size))) for i in range(instances)]
            group = groups[instance]
        # The instance's nodes from the ranks' host names: an instance may span nodes or share
        # one, and its ranks need not sit in runs of local_world_size (srun --distribution=cyclic).
        layout = self.node_layout.within(range(instance * size, (instance + 1) * size))
        return DistContext(
            rank=self.rank % size,
            local_rank=layout.local_rank,
            world_size=size,
            local_world_size=layout.local_size,
            num_nodes=layout.num_nodes,
            device=self.device,
            backend=self.backend if size > 1 else "none",
            launcher=self.launcher,
            group=group,
            instance=instance if instances > 1 else None,
            layout=layout,
            threads=self.threads,
            allocator=self.allocator,
        )

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, backward_passes_per_step: int = 1
    ) -> Any:
        """Horovod's all-reducing optimizer (once per `backward_passes_per_step` backward passes);
        under torch.distributed, DDP already all-reduces and the optimizer is returned as it is."""
        if self._hvd is None or not self.distributed:
            return optimizer
        hvd = self._hvd
        _broadcast_model(hvd, model)
        # The whole state as one object: its tensors may be channels-last (an optimizer's state
        # follows its parameter's layout), which Horovod's tensor broadcast refuses.
        state = hvd.broadcast_object(optimizer.state_dict(), root_rank=0, name="optimizer_state")
        if self.rank != 0:
            optimizer.load_state_dict(state)
        return hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=backward_passes_per_step,
            compression=_ContiguousGradients,
        )


class _ContiguousGradients:
    """Horovod's compression seam, used to hand its all-reduce contiguous gradients: a
    channels-last parameter's gradient is channels-last, and Horovod's collectives take only
    contiguous tensors. The reduced copy becomes the gradient (Horovod sets it back with
    `p.grad.set_`); a contiguous gradient passes through without a copy."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor.contiguous(), None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:
        return tensor


def _broadcast_model(hvd: Any, model: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers to every rank. A channels-last tensor goes through a
    contiguous copy, copied back after (Horovod's broadcast takes only contiguous tensors)."""
    tensors = model.state_dict()
    copies = {name: tensor.contiguous() for name, tensor in tensors.items()}
    hvd.broadcast_parameters(copies, root_rank=0)
    with torch.no_grad():
        for name, tensor in tensors.items():
            if copies[name] is not tensor:
                tensor.copy_(copies[name])


def average_batchnorm_statistics(model: torch.nn.Module, ctx: DistContext) -> None:
    """Set every batch-norm layer's running mean and variance to their mean over the ranks of
    `ctx` (one collective for all layers); nothing to do on one rank or without batch norm."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    buffers = [b for m in layers for b in (m.running_mean, m.running_var) if b is not None]
    if not ctx.distributed or not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1).to(torch.float64) for b in buffers])
    ctx.all_reduce_sum(flat)
    flat /= ctx.world_size
    offset = 0
    for buffer in buffers:
        count = buffer.numel()
        buffer.copy_(flat[offset : offset + count].view_as(buffer))
        offset += count


def init_distributed(
    backend: Backend = "auto", device: str = "auto", launch: LaunchInfo | None = None
) -> DistContext:
    """Join the job this process was launched into; a plain process gets a world of one."""
    launch = launch or detect_launch()
    if backend == "horovod":
        return _init_horovod(device)
    torch_device = _pick_device(device, launch.local_rank)
    chosen = backend if backend != "auto" else ("nccl" if torch_device.type == "cuda" else "gloo")
    if chosen == "nccl" and torch_device.type != "cuda":
        raise ConfigError("backend nccl needs a CUDA device; use backend=gloo on CPU")
    context = DistContext(
        rank=launch.rank,
        local_rank=launch.local_rank,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        num_nodes=launch.num_nodes,
        device=torch_device,
        backend=chosen if launch.world_size > 1 else "none",
        launcher=launch.launcher,
    )
    if torch_device.type == "cpu":
        context.allocator = keep_freed_memory()
    if launch.world_size == 1:
        context.threads = configure_threads(ranks_on_node=1)
        return context
    if not dist.is_initialized():
        addr, port = _rendezvous(launch)
        join_group(chosen, addr, port, launch.rank, launch.world_size, launch.local_world_size)
    context.layout = gather_node_layout(launch.rank)
    context.node_group, context.num_nodes = _node_group(context.layout), context.layout.num_nodes
    context.threads = configure_threads(ranks_on_node=context.layout.local_size)
    return context


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but no CUDA device is visible; use device=cpu")
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device != "cpu":
        raise ConfigError(f"device={device!r} is unknown; use auto, cpu or cuda")
    return torch.device("cpu")


def _rendezvous(launch: LaunchInfo) -> tuple[str, int]:
    """Rank 0's address; under mpirun without MASTER_ADDR, learn it over MPI when mpi4py is there."""
    if launch.launcher != "mpi" or "MASTER_ADDR" in os.environ:
        return launch.master_addr, launch.master_port
    try:
        from mpi4py import MPI
    except ImportError:
        return launch.master_addr, launch.master_port
    host = MPI.COMM_WORLD.bcast(socket.gethostname() if launch.rank == 0 else None, root=0)
    return host, launch.master_port


def gather_node_layout(rank: int) -> NodeLayout:
    """Which ranks share a node, from every rank's host name (a collective on the default group)."""
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return node_layout(hosts, rank)


def _node_group(layout: NodeLayout) -> Any:
    """This rank's node's process group; every rank must create every group, in the same order."""
    groups = [dist.new_group(list(ranks)) for ranks in layout.nodes]
    return groups[layout.node]


def _init_horovod(device: str) -> DistContext:
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise ConfigError(
            "backend=horovod but horovod is not installed; run scripts/install_horovod.sh or use backend=auto"
        ) from e
    hvd.init()
    torch_device = _pick_device(device, hvd.local_rank())
    return DistContext(
        rank=hvd.rank(),
        local_rank=hvd.local_rank(),
        world_size=hvd.size(),
        local_world_size=hvd.local_size(),
        num_nodes=max(1, hvd.size() // max(1, hvd.local_size())),
        device=torch_device,
        backend="horovod",
        launcher="horovod",
        threads=configure_threads(ranks_on_node=hvd.local_size()),
        allocator=keep_freed_memory() if torch_device.type == "cpu" else None,
        _hvd=hvd,
    )
