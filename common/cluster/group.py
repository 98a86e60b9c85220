"""The process group: joined with a timeout on every collective and a heartbeat beside it, so
that a failed collective becomes one line naming the node it lost.

torch.distributed only; `distributed.init_distributed()` calls `join_group`, and the staging
communicator joins through it too.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch.distributed as dist

from mlhpc.common.cluster.liveness import Heartbeat, Silence, host_store
from mlhpc.common.errors import ConfigError, MlhpcError, TrainingError

if TYPE_CHECKING:
    from mlhpc.common.cluster.distributed import DistContext

TIMEOUT_ENV = "MLHPC_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
"""How long one collective waits for the other ranks before it fails (MLHPC_COLLECTIVE_TIMEOUT)."""
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)
"""How long the ranks wait for each other to start (a busy node imports torch slowly)."""


def collective_timeout() -> datetime.timedelta:
    """How long one collective waits before it fails: MLHPC_COLLECTIVE_TIMEOUT seconds (600 by
    default). It bounds how long the ranks wait for a node that died or whose link went down;
    it must exceed the longest wait of one rank for another (rank 0 generating a dataset, the
    slowest staging round)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 1 <= seconds <= 7 * 86400):
        raise ConfigError(
            f"{TIMEOUT_ENV}={raw!r} is not a number of seconds from 1 to 604800; "
            f"set it to e.g. {DEFAULT_TIMEOUT_S:.0f}, or unset it"
        )
    return datetime.timedelta(seconds=seconds)


_heartbeat: Heartbeat | None = None
"""This process's heartbeat in its job's store (common/cluster/liveness), while it is in a group."""


def join_group(
    backend: str, addr: str, port: int, rank: int, world_size: int, local_world_size: int | None = None
) -> None:
    """Initialise the default process group through a TCP store at addr:port (rank 0 hosts it,
    unless torchrun's agent already does), with `collective_timeout()` on every collective, and
    start this rank's heartbeat so that a failed collective can name the node it lost."""
    global _heartbeat
    timeout = collective_timeout()
    url = f"tcp://{addr}:{port}?rank={rank}&world_size={world_size}"
    if rank == 0 and not _agent_store(addr, port):  # listening on the ranks' interface only
        store = host_store(addr, port, world_size, RENDEZVOUS_TIMEOUT, local_world_size)
    else:
        store, _, _ = next(dist.rendezvous(url, timeout=RENDEZVOUS_TIMEOUT))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        _heartbeat = Heartbeat(store, rank, hosts_store=rank == 0 and not _agent_store(addr, port))
    except Exception:  # a store without its own connections (not a TCPStore): failures name no node
        _heartbeat = None


def _agent_store(addr: str, port: int) -> bool:
    """Whether torchrun's agent, not rank 0, holds the store at addr:port."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and (
        os.environ.get("MASTER_ADDR"),
        os.environ.get("MASTER_PORT"),
    ) == (addr, str(port))


def shutdown_distributed() -> None:
    """Stop the heartbeat and destroy the default group."""
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None
    if dist.is_initialized():
        dist.destroy_process_group()


def lost_ranks(ranks: Sequence[int] | None = None) -> Silence | None:
    """After a collective failed: which of `ranks` (global; all by default) stopped answering,
    and the lost node's name (None when this process has no heartbeat, e.g. a group that
    someone else initialised). Takes a few seconds (liveness.LISTEN_S)."""
    if _heartbeat is None or not dist.is_initialized():
        return None
    return _heartbeat.silence(range(dist.get_world_size()) if ranks is None else ranks)


def collective_reason(error: BaseException) -> str:
    """A failed collective's error as a short phrase: gloo's first sentence without its source
    location ("Read error [10.0.0.2]:41234: Connection reset by peer")."""
    text = " ".join(str(error).split())
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(". ", 1)[0].rstrip(".")
    return (text or type(error).__name__)[:160]


def is_collective_failure(error: BaseException) -> bool:
    """Whether `error` is torch.distributed's: a backend or store error, or gloo's RuntimeError."""
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(word in str(error) for word in ("gloo", "NCCL", "c10d"))
    )


@contextlib.contextmanager
def lost_rank_named(ctx: DistContext, fix: str) -> Iterator[None]:
    """Turn a collective that failed because a rank was lost into one line: this rank, the
    collective's error, the node that stopped answering and `fix` (a TrainingError)."""
    try:
        yield
    except MlhpcError:
        raise
    except RuntimeError as error:
        if not ctx.distributed or not is_collective_failure(error):
            raise
        silence = lost_ranks()
        who = silence.words() if silence is not None else "another rank died or was killed"
        raise TrainingError(
            f"rank {ctx.rank} on {socket.gethostname()}: a collective failed ({collective_reason(error)}); "
            f"{who}; {fix}"
        ) from error


