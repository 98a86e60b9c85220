"""The shared loop's settings: every benchmark config has one as its `loop` section.

Plain data with no torch import, so configs load (and `--dry-run` checks them) on a login node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlhpc.common.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16"]
Mode = Literal["target", "fixed_epochs"]
MemoryFormat = Literal["auto", "contiguous", "channels_last", "channels_last_3d"]


@dataclass(kw_only=True, frozen=True)
class LoopConfig:
    """How the shared loop trains: batch, stop rules, numerics and the GPU fast paths."""

    global_batch_size: int
    """Samples per optimizer step over all ranks."""
    max_epochs: int
    """Stop with status aborted if the target is not reached by this epoch."""
    target: float
    """Quality target of the benchmark's metric (e.g. MAE 0.124 for CosmoFlow)."""
    mode: Mode = "target"
    """target: stop at the quality target, aborted at max_epochs (MLPerf's time-to-train);
    fixed_epochs: train exactly max_epochs and score the quality reached (HPC AI500's way, with
    Valid FLOPS from it); the run succeeds if its metric stays finite."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed before each optimizer step (DDP all-reduces on the last one only)."""
    precision: Precision = "fp32"
    """fp32; bf16 (autocast, no loss scaling: the H100's fast path); fp16 (autocast with one
    GradScaler for the whole run)."""
    compile: bool = False
    """torch.compile the model (in place, before the data-parallel wrapper)."""
    memory_format: MemoryFormat = "auto"
    """auto: the benchmark's preferred layout for the device (channels_last_3d for CosmoFlow on a GPU
    and on a CPU); or force one."""
    finite_check_interval: int = 0
    """The loss is checked for NaN/inf on the device at every step, and the ranks agree on it (one
    host sync and one collective) every this many steps and at the end of each epoch (0: at the end
    of each epoch only)."""
    sync_timing: bool = False
    """On a GPU, synchronize at every phase boundary of the time breakdown so that each phase is
    charged its own kernels: exact, but a stall per phase, so only for a breakdown study. False:
    phases time kernel launches; the epoch total is exact either way."""

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"loop.global_batch_size={self.global_batch_size} must be positive")
        if self.max_epochs <= 0:
            raise ValueError(f"loop.max_epochs={self.max_epochs} must be positive")
        if self.gradient_accumulation_steps <= 0:
            raise ValueError("loop.gradient_accumulation_steps must be at least 1")
        if self.finite_check_interval < 0:
            raise ValueError(
                f"loop.finite_check_interval={self.finite_check_interval} must be 0 (end of epoch) or more"
            )

    def local_batch_size(self, world_size: int) -> int:
        """Per-rank micro-batch; the global batch must split evenly over ranks and micro-batches."""
        parts = world_size * self.gradient_accumulation_steps
        if self.global_batch_size % parts:
            raise ConfigError(
                f"loop.global_batch_size={self.global_batch_size} is not divisible by "
                f"world_size x gradient_accumulation_steps={parts}; pick a multiple of {parts}"
            )
        return self.global_batch_size // parts
