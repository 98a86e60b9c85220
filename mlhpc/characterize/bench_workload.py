"""A benchmark's training step as a `Workload`: its model, optimizer and loss at a batch size, fed
the benchmark's example batch (the config's real input size) so that no level needs a dataset.
Picklable, so that each rank of the communication level builds its own."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mlhpc.characterize.workload import Workload
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError
from mlhpc.common.training.batches import MEMORY_FORMATS, to_device
from mlhpc.common.training.loop import resolve_memory_format

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""loop.precision's training dtype: the timed levels autocast to it as the loop does, and the
roofline's GEMM peak is measured in it."""


def training_dtype(cfg: Any) -> torch.dtype:
    return PRECISIONS[cfg.loop.precision]


def _autocast_loss(
    compute_loss: Callable[[torch.nn.Module, Any], torch.Tensor],
    device_type: str,
    dtype: torch.dtype,
    model: torch.nn.Module,
    batch: Any,
) -> torch.Tensor:
    with torch.autocast(device_type, dtype=dtype):
        return compute_loss(model, batch)


def single_process_context(device: torch.device) -> DistContext:
    """A world of one on `device`, whatever launcher variables the environment holds: characterize
    measures one process (the communication level starts its own group)."""
    return DistContext(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        num_nodes=1,
        device=device,
        backend="none",
        launcher="none",
    )


@dataclass(frozen=True)
class BenchWorkload:
    """Builds `benchmark`'s workload at `batch_size` per rank; `device` 'cuda' means the rank's GPU."""

    benchmark: str
    config: str
    overrides: tuple[str, ...]
    batch_size: int
    device: str = "cpu"

    def __call__(self, rank: int = 0) -> Workload:
        bench = registry.get(self.benchmark)
        if bench.example_batch is None:
            raise ConfigError(
                f"benchmark {self.benchmark} has no example_batch function, which characterize's "
                "timed levels need; see docs/ADDING_A_BENCHMARK.md"
            )
        cfg = load_config(bench.config_class, bench.config_path(self.config), list(self.overrides))
        device = torch.device(self.device if self.device == "cpu" else f"cuda:{rank}")
        ctx = single_process_context(device)
        memory_format = resolve_memory_format(cfg.loop, bench, device)
        torch.manual_seed(rank)
        model = bench.build_model(cfg).to(device, memory_format=MEMORY_FORMATS[memory_format])
        # One optimizer step an epoch: the schedules' warm-up then holds a steady learning rate.
        optimizer, _ = bench.build_optimizer(cfg, model, ctx, 1)
        batch = to_device(bench.example_batch(cfg, self.batch_size, device), device, memory_format)
        dtype = training_dtype(cfg)
        # The loop's autocast (common/training/epoch.py); fp16's loss scaling changes no step's cost.
        compute_loss = (
            bench.compute_loss
            if dtype == torch.float32
            else functools.partial(_autocast_loss, bench.compute_loss, device.type, dtype)
        )
        return Workload(
            model=model,
            optimizer=optimizer,
            compute_loss=compute_loss,
            batches=itertools.repeat(batch),
            device=device,
            batch_size=self.batch_size,
        )
