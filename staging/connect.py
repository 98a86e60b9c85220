"""The staging communicator for this process: from the launcher's environment (`mlhpc stage`
on its own) or from the run's `DistContext` (`mlhpc run`). torch and mpi4py are imported only
for the communicator that needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from mlhpc.common.cluster.launch import LaunchInfo, detect_launch
from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import CallbackComm, Communicator, MpiComm, mpi_available

if TYPE_CHECKING:
    from mlhpc.common.cluster.distributed import DistContext

CommKind = Literal["auto", "torch", "mpi"]


def make_comm(
    kind: CommKind = "auto", *, each_rank_a_node: bool = False, launch: LaunchInfo | None = None
) -> Communicator:
    """The communicator for a `mlhpc stage` process: none for one process, MPI when that is the
    launcher and mpi4py is installed, else torch.distributed (gloo)."""
    launch = launch or detect_launch()
    if launch.world_size == 1 and kind == "auto":
        return CallbackComm()
    if kind == "mpi" or (kind == "auto" and launch.launcher == "mpi" and mpi_available()):
        return MpiComm(each_rank_a_node=each_rank_a_node)
    from mlhpc.staging.torch_comm import TorchComm

    return TorchComm.launch(launch, each_rank_a_node=each_rank_a_node)


def comm_for(ctx: DistContext, *, beside_training: bool = False) -> Communicator:
    """Staging's collectives for a run, on the node layout `ctx` gathered at init: MPI when
    mpirun started the job and mpi4py is there, else the torch.distributed group; under Horovod,
    or for one instance of a weak-scaling job, only barriers (every node copies).
    `beside_training` (--staging overlap): collectives of its own, which a staging thread can use
    while training uses the run's; refused where the run's barrier is all there is."""
    if not ctx.distributed:
        return CallbackComm()
    layout = ctx.node_layout
    if ctx.launcher == "mpi" and ctx.group is None and mpi_available():
        return MpiComm(layout)
    if ctx.backend == "horovod" or ctx.group is not None:
        if beside_training:
            raise StagingError(
                "--staging overlap needs collectives of its own beside training's, which Horovod and "
                "--instances do not give it; use --staging inside"
            )
        return CallbackComm(
            layout.local_rank, layout.local_size, ctx.barrier, node=layout.node, num_nodes=layout.num_nodes
        )
    from mlhpc.staging.torch_comm import TorchComm

    return TorchComm(layout, own_groups=beside_training)
