"""Learning-rate schedules by optimizer step: linear warm-up, then multistep or cosine decay.

The MLPerf HPC DeepCAM reference's `MultiStepLRWarmup` / `CosineAnnealingLRWarmup` as one pure
function of the step, wrapped in torch's LambdaLR (multiplier of the optimizer's base LR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True, kw_only=True)
class WarmupSchedule:
    """LR multiplier at optimizer step t (0 before the first step)."""

    kind: Literal["multistep", "cosine_annealing", "constant"]
    warmup_steps: int = 0
    warmup_factor: float = 1.0
    """1: warm up from 0 to the base LR; f > 1: from the base LR to f times it."""
    milestones: tuple[int, ...] = ()
    """multistep: steps after the warm-up at which the LR is multiplied by decay_rate."""
    decay_rate: float = 0.1
    t_max: int = 1
    """cosine_annealing: steps after the warm-up from the peak down to eta_min (periodic after)."""
    eta_min_ratio: float = 0.0
    """cosine_annealing: the floor as a fraction of the base LR."""

    def __call__(self, step: int) -> float:
        peak = self.warmup_factor
        if step <= self.warmup_steps and self.warmup_steps > 0:
            progress = step / self.warmup_steps
            return progress if self.warmup_factor == 1.0 else 1.0 + (self.warmup_factor - 1.0) * progress
        after = step - self.warmup_steps
        if self.kind == "multistep":
            return peak * self.decay_rate ** sum(after >= m for m in self.milestones)
        if self.kind == "cosine_annealing":
            floor = self.eta_min_ratio
            return floor + (peak - floor) * (1.0 + math.cos(math.pi * after / self.t_max)) / 2.0
        return peak


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: WarmupSchedule
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step scheduler (call .step() after every optimizer step)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
