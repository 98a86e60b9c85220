"""Extreme weather's optimizer, LR schedule, loss, logged hyperparameters and run-end FLOPS events."""

from __future__ import annotations

import math
from typing import Any

import torch

from mlhpc.benchmarks.extreme_weather import BENCHMARK
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract import catalog
from mlhpc.common.errors import ConfigError
from mlhpc.common.log_keys import (
    ACHIEVED_FLOPS,
    FLOPS_PER_SAMPLE,
    LOOP_MODE,
    VALID_FLOPS,
    VFLOPS_EXPONENT,
)
from mlhpc.common.training.loop import RunResult
from mlhpc.submission_checker import hpc_ai500


def scaled_learning_rate(cfg: ExtremeWeatherConfig) -> float:
    """Linear scaling from base_learning_rate at base_batch_size to the global batch size."""
    opt = cfg.optimizer
    return opt.base_learning_rate * cfg.loop.global_batch_size / opt.base_batch_size


def lr_multiplier(cfg: ExtremeWeatherConfig, epoch_progress: float) -> float:
    """Multiplier of the scaled LR after `epoch_progress` epochs (fractional during warm-up)."""
    opt = cfg.optimizer
    if epoch_progress < opt.warmup_epochs:
        return opt.warmup_factor + (1.0 - opt.warmup_factor) * epoch_progress / opt.warmup_epochs
    passed = sum(math.floor(epoch_progress) >= b for b in opt.decay_boundary_epochs)
    return opt.decay_factor**passed


def build_optimizer(
    cfg: ExtremeWeatherConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(
        params,
        lr=scaled_learning_rate(cfg),
        momentum=cfg.optimizer.momentum,
        weight_decay=cfg.optimizer.weight_decay,
    )
    if cfg.optimizer.max_grad_norm > 0:
        _clip_before_step(optimizer, params, cfg.optimizer.max_grad_norm)
    steps = max(1, steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(cfg, step / steps))
    return optimizer, scheduler


def _clip_before_step(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], norm: float
) -> None:
    # The shared loop owns the step; a pre-hook clips exactly where a hand-written loop would.
    def clip(*_: Any) -> None:
        torch.nn.utils.clip_grad_norm_(params, norm)

    optimizer.register_step_pre_hook(clip)


def compute_loss(
    model: torch.nn.Module, batch: tuple[torch.Tensor, list[dict[str, torch.Tensor]]]
) -> torch.Tensor:
    """The sum of Faster R-CNN's four losses (RPN objectness and boxes, head classes and boxes)."""
    images, targets = batch
    losses = model(images, targets)
    return torch.stack([v for v in losses.values()]).sum()


def example_batch(
    cfg: ExtremeWeatherConfig, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """(images, targets) as the loader collates them: normalised (C, H, W) float32 snapshots and,
    per image, one valid box (x1, y1, x2, y2) over the middle quarter, labelled tropical cyclone,
    so that every detection loss runs."""
    d = cfg.data
    images = torch.randn(batch_size, d.num_channels, d.height, d.width, device=device)
    box = [d.width / 4, d.height / 4, 3 * d.width / 4, 3 * d.height / 4]
    targets = [
        {
            "boxes": torch.tensor([box], dtype=torch.float32, device=device),
            "labels": torch.tensor([2], dtype=torch.int64, device=device),  # class 1 + 1 (background)
        }
        for _ in range(batch_size)
    ]
    return images, targets


def hyperparameters(cfg: ExtremeWeatherConfig, ctx: DistContext) -> dict[str, Any]:
    """The keys closed_extreme_weather.yaml requires or allows, with their values."""
    opt = cfg.optimizer
    return {
        "global_batch_size": cfg.loop.global_batch_size,
        "gradient_accumulation_frequency": cfg.loop.gradient_accumulation_steps,
        "opt_name": "sgd",
        "opt_base_learning_rate": scaled_learning_rate(cfg),
        "opt_momentum": opt.momentum,
        "opt_weight_decay": opt.weight_decay,
        "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
        "opt_learning_rate_warmup_factor": opt.warmup_factor,
        "opt_learning_rate_decay_boundary_epochs": list(opt.decay_boundary_epochs),
        "opt_learning_rate_decay_factor": opt.decay_factor,
        "opt_gradient_clip_norm": opt.max_grad_norm,
        "model_backbone": cfg.model.backbone,
        VFLOPS_EXPONENT: cfg.quality.vflops_exponent,
        # The rules require the target of a target-mode run only; `mlhpc check` scores a
        # fixed-epoch run by its Valid FLOPS penalty.
        LOOP_MODE: cfg.loop.mode,
    }


def run_end_events(cfg: ExtremeWeatherConfig, result: RunResult) -> dict[str, Any]:
    """FLOPs per sample, achieved FLOP/s (over forward + backward seconds, a diagnostic) and HPC
    AI500's Valid FLOPS: the run's FLOPS over its own time (run_start .. run_stop, as `mlhpc check`
    scores it) x (last evaluation's mAP / the rule file's target)^n."""
    quality = result.metrics[-1] if result.metrics else 0.0
    quality = quality if math.isfinite(quality) and quality > 0 else 0.0  # an aborted run's NaN scores 0
    flops = hpc_ai500.run_flops(
        result.flops_per_sample, result.train_samples, result.epochs, result.run_seconds
    )
    target = hpc_ai500.target(BENCHMARK.name)
    if target is None:  # only when the catalog lost this benchmark's rule file
        raise ConfigError(f"no HPC AI500 target for {BENCHMARK.name}; {catalog.REINSTALL}")
    return {
        FLOPS_PER_SAMPLE: result.flops_per_sample,
        ACHIEVED_FLOPS: result.achieved_flops_per_s,
        VALID_FLOPS: hpc_ai500.valid_flops(flops or 0.0, quality, target, cfg.quality.vflops_exponent),
    }
