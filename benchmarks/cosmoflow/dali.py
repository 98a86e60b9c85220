"""CosmoFlow through NVIDIA DALI's numpy reader: the files and transform of the torch loader,
decoded on the CPU and transformed on the GPU when the run has one (the `gpu` extra).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.benchmarks.cosmoflow.data import read_file_lists
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError
from mlhpc.common.training.dali import DaliLoader, dali_iterator, device_id, import_dali

OUTPUTS = ("cube", "target")
READER = "cube_reader"


def build_dali_data(cfg: CosmoFlowConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    """Train and validation DALI loaders for this rank; global sample counts as the torch path."""
    dali = import_dali()
    data_dir = Path(data_dir)
    batch = cfg.loop.local_batch_size(ctx.world_size)
    train_pairs = read_file_lists(data_dir / "train")
    eval_pairs = read_file_lists(data_dir / "validation")
    if len(train_pairs) < cfg.loop.global_batch_size:
        raise DataError(
            f"{data_dir}/train has {len(train_pairs)} samples, fewer than loop.global_batch_size="
            f"{cfg.loop.global_batch_size}; generate more samples or lower the batch size"
        )
    if len(eval_pairs) < ctx.world_size:
        # DALI refuses an empty shard, where the torch loader would give that rank nothing.
        raise DataError(
            f"{data_dir}/validation has {len(eval_pairs)} samples, fewer than world_size="
            f"{ctx.world_size}; DALI needs one per rank: generate more or use data.loader=torch"
        )
    # DistributedSampler(drop_last=True) arithmetic: every rank takes the same number of full batches.
    train_steps = len(train_pairs) // ctx.world_size // batch
    # DALI's shard r is the contiguous slice [r*N//K, (r+1)*N//K) of the list.
    n, k = len(eval_pairs), ctx.world_size
    eval_steps = math.ceil(((ctx.rank + 1) * n // k - ctx.rank * n // k) / batch)
    train = _iterator(dali, cfg, data_dir / "train", train_pairs, ctx, seed, batch, training=True)
    validation = _iterator(dali, cfg, data_dir / "validation", eval_pairs, ctx, seed, batch, training=False)
    return DataBundle(
        train=DaliLoader(train, outputs=OUTPUTS, steps=train_steps),
        validation=DaliLoader(validation, outputs=OUTPUTS, steps=eval_steps),
        train_samples=len(train_pairs),
        eval_samples=len(eval_pairs),
        set_epoch=None,  # the train reader reshuffles the whole list itself after every epoch
        loader="dali",
    )


def _iterator(
    dali: ModuleType,
    cfg: CosmoFlowConfig,
    split_dir: Path,
    pairs: list[tuple[Path, Path]],
    ctx: DistContext,
    seed: int,
    batch: int,
    *,
    training: bool,
) -> Any:
    fn, types = dali.fn, dali.types
    on_gpu = ctx.device.type == "cuda"
    pipeline_device = device_id(ctx)
    dali_seed = seed % 2**31  # DALI seeds are C ints; the harness's may be any Python int
    # Data and label readers get the same list, shard and seed, so they visit samples in the same order.
    reader_args: dict[str, Any] = {
        "device": "cpu",
        "file_root": str(split_dir),
        "shard_id": ctx.rank,
        "num_shards": ctx.world_size,
        # Pad the shard's last batch with its last sample (the iterator drops the copies) instead of
        # borrowing the next epoch's first samples, so every epoch starts at the same place.
        "pad_last_batch": True,
        "seed": dali_seed,
    }
    if training:
        # A global reshuffle each epoch, the same on every rank: DistributedSampler's behaviour.
        reader_args |= {"shuffle_after_epoch": True, "shuffle_after_epoch_seed": dali_seed}
    else:
        reader_args["stick_to_shard"] = True  # each rank re-reads the same files: page cache stays warm

    @dali.pipeline_def(
        batch_size=batch, num_threads=max(1, cfg.data.num_workers), device_id=pipeline_device, seed=dali_seed
    )
    def pipeline() -> tuple[Any, Any]:
        cube = fn.readers.numpy(
            files=[str(d.relative_to(split_dir)) for d, _ in pairs], name=READER, **reader_args
        )
        target = fn.readers.numpy(files=[str(lab.relative_to(split_dir)) for _, lab in pairs], **reader_args)
        if on_gpu:
            cube, target = cube.gpu(), target.gpu()
        cube = fn.cast(cube, dtype=types.FLOAT)
        if cfg.data.apply_log:
            cube = dali.math.log(cube + 1.0)  # dali.math has no log1p; 1 + count is exact in float32
        cube = fn.transpose(cube, perm=[3, 0, 1, 2])  # (S, S, S, C) -> (C, S, S, S), as torch's Conv3d wants
        return cube, fn.cast(target, dtype=types.FLOAT)

    return dali_iterator(dali, pipeline(), OUTPUTS, what=str(split_dir), reader_name=READER)
