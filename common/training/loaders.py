"""The torch DataLoader pair every benchmark's torch path builds: shuffled, sharded train batches
and disjoint, unpadded validation shards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError, MlhpcError
from mlhpc.common.safeio.datasets import RestoreReadThrough
from mlhpc.common.training.loop_config import LoopConfig


class OneLineLoader(DataLoader):
    """A DataLoader whose workers' mlhpc errors stay one line naming the file: torch re-raises an
    error from a worker as "Caught DataError in DataLoader worker process 0." followed by the
    worker's traceback, and the command line shows only that first line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0) > 0 and kwargs.get("worker_init_fn") is None:
            kwargs["worker_init_fn"] = RestoreReadThrough()  # a dataset being staged (--staging overlap)
        super().__init__(*args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except MlhpcError as e:
                raise type(e)(worker_line(e)) from e
            yield batch


def worker_line(error: BaseException) -> str:
    """The worker's own message inside torch's re-raised one (the last line of the traceback
    it carries, after the exception's name); the message itself when it is no such wrapper."""
    text = str(error)
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith("Caught "):
        return text
    name = type(error).__name__
    last = lines[-1]
    head, sep, message = last.partition(": ")
    return message if sep and head.rsplit(".", 1)[-1] == name else last


def torch_data_bundle(
    train: Dataset,
    validation: Dataset,
    *,
    loop: LoopConfig,
    ctx: DistContext,
    seed: int,
    num_workers: int,
    where: Path | str,
) -> DataBundle:
    """Loaders for this rank; DataError when `train` cannot fill one global batch."""
    if len(train) < loop.global_batch_size:  # type: ignore[arg-type]
        raise DataError(
            f"{where}/train has {len(train)} samples, fewer than loop.global_batch_size="  # type: ignore[arg-type]
            f"{loop.global_batch_size}; generate more samples or lower the batch size"
        )
    batch = loop.local_batch_size(ctx.world_size)
    sampler = DistributedSampler(
        train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True
    )
    loader_args = {
        "num_workers": num_workers,
        "pin_memory": ctx.device.type == "cuda",
        "persistent_workers": num_workers > 0,
    }
    # Disjoint, unpadded validation shards: an all-reduced metric covers each sample once.
    shard = Subset(validation, range(ctx.rank, len(validation), ctx.world_size))  # type: ignore[arg-type]
    return DataBundle(
        train=OneLineLoader(train, batch_size=batch, sampler=sampler, drop_last=True, **loader_args),
        validation=OneLineLoader(shard, batch_size=batch, shuffle=False, **loader_args),
        train_samples=len(train),  # type: ignore[arg-type]
        eval_samples=len(validation),  # type: ignore[arg-type]
        set_epoch=sampler.set_epoch,
    )
