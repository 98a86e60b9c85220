"""CosmoFlow's optimizer, LR schedule, loss and the hyperparameters its MLLOG rules require."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.benchmarks.cosmoflow.model import NUM_TARGETS
from mlhpc.common.cluster.distributed import DistContext


def scaled_learning_rate(cfg: CosmoFlowConfig) -> float:
    """Linear scaling from base_learning_rate at base_batch_size to the global batch size."""
    opt = cfg.optimizer
    return opt.base_learning_rate * cfg.loop.global_batch_size / opt.base_batch_size


def warmup_factor(cfg: CosmoFlowConfig) -> float:
    """Peak LR over base LR: linear scaling from base_batch_size to the global batch size."""
    return cfg.loop.global_batch_size / cfg.optimizer.base_batch_size


def lr_multiplier(cfg: CosmoFlowConfig, epoch_progress: float) -> float:
    """Multiplier of the peak LR after `epoch_progress` epochs (0 at the first step of epoch_num 1)."""
    opt = cfg.optimizer
    epoch_index = math.floor(epoch_progress)
    if epoch_index < opt.warmup_epochs:
        start = 1.0 / warmup_factor(cfg)
        done = epoch_index if opt.warmup_stepping == "epoch" else epoch_progress
        return start + (1.0 - start) * done / opt.warmup_epochs
    return opt.decay_multiplier(epoch_index)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay (the coefficient on the gradient) on the hidden dense layers' kernels only (the
    TF reference's L2 regulariser on them, NVIDIA's explicit groups); convolutions, biases and the
    output layer get none. Each group keeps its parameters' names for the dry run."""
    net = getattr(model, "module", model)
    chosen = {id(layer.weight) for layer in net.dense}
    named = list(model.named_parameters())
    decayed = [(n, p) for n, p in named if id(p) in chosen]
    rest = [(n, p) for n, p in named if id(p) not in chosen]
    return [
        {"params": [p for _, p in decayed], "names": [n for n, _ in decayed], "weight_decay": weight_decay},
        {"params": [p for _, p in rest], "names": [n for n, _ in rest], "weight_decay": 0.0},
    ]


class VelocitySGD(torch.optim.SGD):
    """SGD with the LR inside the velocity: v = m v + lr (g + wd w); p -= v. Keras' and MXNet's SGD
    and NVIDIA's CosmoFlow FixedSGD update this way; torch's SGD puts lr outside (p -= lr v).
    `foreach` (the default) updates a group's tensors in a few multi-tensor kernels instead of a few
    per tensor; the same operations in the same order, so the same bits as the per-tensor loop
    (tests/perf/test_gpu_suite_optim.py)."""

    def __init__(self, params: Any, *, foreach: bool = True, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.multi_tensor = foreach

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            velocities = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                velocities.append(state["momentum_buffer"])
            update = _update_foreach if self.multi_tensor else _update_per_tensor
            if params:
                update(params, velocities, group["lr"], group["momentum"], group["weight_decay"])
        return loss


def _update_per_tensor(
    params: list[Any], velocities: list[Any], lr: float, momentum: float, decay: float
) -> None:
    for p, velocity in zip(params, velocities, strict=True):
        grad = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
        velocity.mul_(momentum).add_(grad, alpha=lr)
        p.sub_(velocity)


def _update_foreach(
    params: list[Any], velocities: list[Any], lr: float, momentum: float, decay: float
) -> None:
    grads = [p.grad for p in params]
    if decay != 0:
        grads = torch._foreach_add(grads, params, alpha=decay)
    torch._foreach_mul_(velocities, momentum)
    torch._foreach_add_(velocities, grads, alpha=lr)
    torch._foreach_sub_(params, velocities)


def build_optimizer(
    cfg: CosmoFlowConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """SGD over optimizer steps; `steps_per_epoch` counts optimizer steps, not micro-batches."""
    opt = cfg.optimizer
    kind = VelocitySGD if opt.momentum_form == "lr_in_velocity" else torch.optim.SGD
    optimizer = kind(
        parameter_groups(model, opt.gradient_weight_decay()),
        lr=scaled_learning_rate(cfg),
        momentum=opt.momentum,
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


def example_batch(
    cfg: CosmoFlowConfig, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cube, target) as the loader gives them: channels-first float32 cubes and 4 targets."""
    size = cfg.data.sample_size
    cube = torch.rand(batch_size, cfg.data.num_channels, size, size, size, device=device)
    return cube, torch.rand(batch_size, NUM_TARGETS, device=device) * 2 - 1


def hyperparameters(cfg: CosmoFlowConfig, ctx: DistContext) -> dict[str, Any]:
    """The keys hpc_<ruleset>/closed_cosmoflow.yaml requires or allows, with the values and the
    spelling of the reference runs: opt_base_learning_rate is the peak (scaled) LR, as the HPC rules
    define it and every reference run logged it; the decay factors as the reference logged them."""
    opt = cfg.optimizer
    factors = list(opt.decay_factors)
    logged_factor: Any = factors
    if opt.decay_factor_logged == "max":
        logged_factor = max(factors, default=1.0)
    return {
        "global_batch_size": cfg.loop.global_batch_size,
        "opt_name": "SGD",
        "opt_base_learning_rate": scaled_learning_rate(cfg),
        "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
        "opt_learning_rate_warmup_factor": warmup_factor(cfg),
        "opt_learning_rate_decay_boundary_epochs": list(opt.decay_boundary_epochs),
        "opt_learning_rate_decay_factor": logged_factor,
        "opt_momentum": opt.momentum,
        "opt_weight_decay": opt.weight_decay,
        "dropout": cfg.model.dropout,
    }
