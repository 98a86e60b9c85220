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


def warmup_factor(cfg: CosmoFlowConfig) -> float:
    """Peak LR over base LR: linear scaling from base_batch_size to the global batch size."""
    return cfg.loop.global_batch_size / cfg.optimizer.base_batch_size


def lr_multiplier(cfg: CosmoFlowConfig, epoch_progress: float) -> float:
    """Multiplier of the scaled LR after `epoch_progress` epochs (fractional during warm-up)."""
    opt = cfg.optimizer
    start = 1.0 / warmup_factor(cfg)
    if epoch_progress < opt.warmup_epochs:
        return start + (1.0 - start) * epoch_progress / opt.warmup_epochs
    passed = sum(math.floor(epoch_progress) >= boundary for boundary in opt.decay_boundary_epochs)
    return opt.decay_multiplier(passed)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the hidden dense layers' kernels only (the TF reference's L2 regulariser on
    them, NVIDIA's explicit groups); convolutions, biases and the output layer get none."""
    net = getattr(model, "module", model)
    decayed = [layer.weight for layer in net.dense]
    chosen = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def build_optimizer(
    cfg: CosmoFlowConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """SGD over optimizer steps; `steps_per_epoch` counts optimizer steps, not micro-batches."""
    optimizer = torch.optim.SGD(
        parameter_groups(model, cfg.optimizer.weight_decay),
        lr=scaled_learning_rate(cfg),
        momentum=cfg.optimizer.momentum,
    )
    return optimizer, lr_scheduler(cfg, optimizer, steps_per_epoch)


def lr_scheduler(
    cfg: CosmoFlowConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The epoch-based schedule, stepped once per optimizer step."""
    steps = max(1, steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(cfg, step / steps))


def compute_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cube, target = batch
    return F.mse_loss(model(cube).float(), target)


def hyperparameters(cfg: CosmoFlowConfig, ctx: DistContext) -> dict[str, Any]:
    """The keys hpc_<ruleset>/closed_cosmoflow.yaml requires or allows, with the values and the
    spelling of the RCP references (the base LR before scaling, the factor to the peak)."""
    opt = cfg.optimizer
    factors = list(opt.decay_factors)
    return {
        "global_batch_size": cfg.loop.global_batch_size,
        "opt_name": "SGD",
        "opt_base_learning_rate": opt.base_learning_rate,
        "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
        "opt_learning_rate_warmup_factor": warmup_factor(cfg),
        "opt_learning_rate_decay_boundary_epochs": list(opt.decay_boundary_epochs),
        "opt_learning_rate_decay_factor": factors[0] if len(factors) == 1 else factors,
        "opt_momentum": opt.momentum,
        "opt_weight_decay": opt.weight_decay,
        "dropout": cfg.model.dropout,
    }
