"""CosmoFlow's optimizer, LR schedule, loss and the hyperparameters its MLLOG rules require."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.distributed import DistContext


def scaled_learning_rate(cfg: CosmoFlowConfig) -> float:
    """Linear scaling from base_learning_rate at base_batch_size to the global batch size."""
    opt = cfg.optimizer
    return opt.base_learning_rate * cfg.loop.global_batch_size / opt.base_batch_size


def lr_multiplier(cfg: CosmoFlowConfig, epoch_progress: float) -> float:
    """Multiplier of the scaled LR after `epoch_progress` epochs (fractional during warm-up)."""
    opt = cfg.optimizer
    start = opt.base_learning_rate / scaled_learning_rate(cfg)
    if epoch_progress < opt.warmup_epochs:
        return start + (1.0 - start) * epoch_progress / opt.warmup_epochs
    factor = 1.0
    for boundary, decay in zip(opt.decay_boundary_epochs, opt.decay_factors, strict=True):
        if math.floor(epoch_progress) >= boundary:
            factor = decay
    return factor


def build_optimizer(
    cfg: CosmoFlowConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=scaled_learning_rate(cfg),
        momentum=cfg.optimizer.momentum,
        weight_decay=cfg.optimizer.weight_decay,
    )
    steps = max(1, steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(cfg, step / steps))
    return optimizer, scheduler


def compute_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cube, target = batch
    return F.mse_loss(model(cube).float(), target)


def hyperparameters(cfg: CosmoFlowConfig, ctx: DistContext) -> dict[str, Any]:
    """The keys hpc_<ruleset>/closed_cosmoflow.yaml requires or allows, with their values."""
    opt = cfg.optimizer
    return {
        "global_batch_size": cfg.loop.global_batch_size,
        "opt_name": "sgd",
        "opt_base_learning_rate": scaled_learning_rate(cfg),
        "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
        "opt_learning_rate_warmup_factor": scaled_learning_rate(cfg) / opt.base_learning_rate,
        "opt_learning_rate_decay_boundary_epochs": list(opt.decay_boundary_epochs),
        "opt_learning_rate_decay_factor": list(opt.decay_factors),
        "opt_momentum": opt.momentum,
        "opt_weight_decay": opt.weight_decay,
        "dropout": cfg.model.dropout,
    }
