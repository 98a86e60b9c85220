"""DeepCAM through NVIDIA DALI (the `gpu` extra). DALI has no HDF5 reader, so parallel Python
workers read the files with h5py (or numpy) and feed `fn.external_source`; DALI normalises and
transposes, on the GPU when the run has one. Batches and their order equal the torch loader's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler

from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.benchmarks.deepcam.data import DeepCamFiles, read_stats
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError
from mlhpc.common.training.dali import DaliLoader, dali_iterator, device_id, import_dali

OUTPUTS = ("fields", "label")


@dataclass
class BatchSource:
    """Picklable batch callback for DALI's parallel external source: batch i of epoch e holds the
    samples a DistributedSampler (epoch e + 1, the loop's numbering) or a validation shard gives."""

    files: DeepCamFiles
    batch: int
    seed: int
    rank: int
    world_size: int
    training: bool

    def indices(self, epoch_idx: int) -> list[int]:
        if not self.training:
            return list(range(self.rank, len(self.files), self.world_size))
        sampler = DistributedSampler(
            self.files, self.world_size, self.rank, shuffle=True, seed=self.seed, drop_last=True
        )
        sampler.set_epoch(epoch_idx + 1)
        order = list(sampler)
        return order[: len(order) // self.batch * self.batch]  # drop_last, as the DataLoader

    def __call__(self, info: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        chosen = self.indices(info.epoch_idx)[info.iteration * self.batch : (info.iteration + 1) * self.batch]
        if not chosen:
            raise StopIteration
        samples = [self.files.read(i) for i in chosen]
        return [np.ascontiguousarray(d, np.float32) for d, _ in samples], [
            np.ascontiguousarray(lab, np.int32) for _, lab in samples
        ]


def build_dali_data(cfg: DeepCamConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    dali = import_dali()
    data_dir = Path(data_dir)
    batch = cfg.loop.local_batch_size(ctx.world_size)
    stats = read_stats(data_dir, cfg.data.num_channels)
    loaders = {}
    for split, training in (("train", True), ("validation", False)):
        files = DeepCamFiles(data_dir / split, file_format=cfg.data.format, stats=stats)
        if training and len(files) < cfg.loop.global_batch_size:
            raise DataError(
                f"{data_dir}/train has {len(files)} samples, fewer than loop.global_batch_size="
                f"{cfg.loop.global_batch_size}; generate more samples or lower the batch size"
            )
        source = BatchSource(files, batch, seed, ctx.rank, ctx.world_size, training)
        steps = -(-len(source.indices(0)) // batch)
        loaders[split] = (
            DaliLoader(_iterator(dali, cfg, source, stats, ctx, data_dir / split), outputs=OUTPUTS, steps=steps),
            files,
        )
    return DataBundle(
        train=loaders["train"][0],
        validation=loaders["validation"][0],
        train_samples=len(loaders["train"][1]),
        eval_samples=len(loaders["validation"][1]),
        loader="dali",
    )


def _iterator(
    dali: ModuleType,
    cfg: DeepCamConfig,
    source: BatchSource,
    stats: tuple[np.ndarray, np.ndarray],
    ctx: DistContext,
    split_dir: Path,
) -> Any:
    fn, types = dali.fn, dali.types
    on_gpu = ctx.device.type == "cuda"
    pipeline_device = device_id(ctx)
    shift, scale = (s.reshape(1, 1, -1) for s in stats)  # (1, 1, C): fields arrive (H, W, C)

    @dali.pipeline_def(
        batch_size=source.batch,
        num_threads=max(1, cfg.data.num_workers),
        device_id=pipeline_device,
        seed=source.seed % 2**31,
        py_num_workers=max(1, cfg.data.num_workers),
        # A forked worker cannot use the CUDA the loop has already set up: spawn on a GPU run.
        py_start_method="spawn" if on_gpu else "fork",
    )
    def pipeline() -> tuple[Any, Any]:
        fields, label = fn.external_source(
            source=source,
            num_outputs=2,
            batch=True,
            batch_info=True,
            parallel=True,
            dtype=[types.FLOAT, types.INT32],
        )
        if on_gpu:
            fields, label = fields.gpu(), label.gpu()
        fields = (fields - types.Constant(shift)) * types.Constant(scale)
        fields = fn.transpose(fields, perm=[2, 0, 1])  # (H, W, C) -> (C, H, W)
        return fields, fn.cast(label, dtype=types.INT64)

    return dali_iterator(dali, pipeline(), OUTPUTS, what=str(split_dir))
