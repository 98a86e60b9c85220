"""DeepCAM's optimizer, LR schedule, weighted loss and the hyperparameters its MLLOG rules require."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.training.schedules import WarmupSchedule, build_lr_scheduler


def schedule(cfg: DeepCamConfig) -> WarmupSchedule:
    opt = cfg.optimizer
    return WarmupSchedule(
        kind=opt.scheduler,
        warmup_steps=opt.warmup_steps,
        warmup_factor=opt.warmup_factor,
        milestones=opt.milestones,
        decay_rate=opt.decay_rate,
        t_max=opt.t_max,
        eta_min_ratio=opt.eta_min / opt.lr,
    )


def build_optimizer(
    cfg: DeepCamConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    opt = cfg.optimizer
    common = {"lr": opt.lr, "betas": tuple(opt.betas), "eps": opt.eps, "weight_decay": opt.weight_decay}
    optimizer: torch.optim.Optimizer
    if opt.name == "LAMB":
        from timm.optim import Lamb  # here: timm takes seconds to import, and only LAMB needs it

        # timm's Lamb follows apex FusedLAMB, the reference's: bias correction, averaged gradients,
        # the global gradient norm clipped to max_grad_norm, decoupled weight decay, trust ratio
        # on the parameters that decay.
        optimizer = Lamb(
            model.parameters(),
            bias_correction=True,
            grad_averaging=True,
            max_grad_norm=opt.max_grad_norm,
            **common,
            **lamb_multi_tensor(Lamb),
        )
    elif opt.name == "AdamW":
        optimizer = torch.optim.AdamW(model.parameters(), **common)
    else:
        optimizer = torch.optim.Adam(model.parameters(), **common)
    return optimizer, build_lr_scheduler(optimizer, schedule(cfg))


def lamb_multi_tensor(lamb: type) -> dict[str, Any]:
    """timm's Lamb steps all tensors of a group in multi-tensor (`_foreach_*`) kernels where it has
    that path (timm >= 1.0.20's `foreach`): on CUDA only, timm's default, because on the CPU the
    two paths round differently (tests/perf/test_gpu_suite_optim.py). An older timm steps per tensor."""
    return {"foreach": None} if "foreach" in inspect.signature(lamb.__init__).parameters else {}


def compute_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The reference's CELoss: per-pixel class-weighted cross-entropy, averaged over all pixels
    (not over the weights, as reduction='mean' would); the weights are the model's buffer."""
    fields, label = batch
    weight = getattr(model, "module", model).loss_weights  # DDP keeps the model in .module
    return F.cross_entropy(model(fields).float(), label, weight=weight, reduction="none").mean()


def example_batch(
    cfg: DeepCamConfig, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fields, label) as the loader gives them: normalised channels-first float32 fields in [0, 1]
    and an int64 class map (all background: any valid class id will do)."""
    d = cfg.data
    fields = torch.rand(batch_size, d.num_channels, d.height, d.width, device=device)
    return fields, torch.zeros(batch_size, d.height, d.width, dtype=torch.int64, device=device)


def hyperparameters(cfg: DeepCamConfig, ctx: DistContext) -> dict[str, Any]:
    """The keys hpc_<ruleset>/closed_deepcam*.yaml require, with their values."""
    opt = cfg.optimizer
    keys: dict[str, Any] = {
        "global_batch_size": cfg.loop.global_batch_size,
        "batchnorm_group_size": 1,  # per-rank BN statistics, the reference default
        "gradient_accumulation_frequency": cfg.loop.gradient_accumulation_steps,
        "opt_name": opt.name,
        "opt_lr": opt.lr,
        "opt_betas": list(opt.betas),
        "opt_eps": opt.eps,
        "opt_weight_decay": opt.weight_decay,
    }
    if opt.name == "LAMB":
        keys |= {
            "opt_bias_correction": True,
            "opt_grad_averaging": True,
            "opt_max_grad_norm": opt.max_grad_norm,
        }
    keys |= {
        "scheduler_type": opt.scheduler,
        "scheduler_lr_warmup_steps": opt.warmup_steps,
        "scheduler_lr_warmup_factor": opt.warmup_factor,
        "scheduler_decay_rate": opt.decay_rate,  # the reference logs it for either schedule
    }
    if opt.scheduler == "multistep":
        keys |= {"scheduler_milestones": list(opt.milestones)}
    else:
        keys |= {"scheduler_t_max": opt.t_max, "scheduler_eta_min": opt.eta_min}
    keys["num_workers"] = cfg.data.num_workers
    return keys
