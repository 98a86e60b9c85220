"""One AIPerf trial on one node: train an architecture for its epoch budget, data parallel over the
node's ranks, log every finished epoch, and report the accuracy the search ranks it by."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.benchmarks.aiperf.node import NodeGroup
from mlhpc.benchmarks.aiperf.search import TrialPlan

EPOCHS_FILE = "epochs.jsonl"


@dataclass(frozen=True)
class TrialOutcome:
    epochs: int
    """Epochs finished (and logged) before the end or the deadline."""
    best_accuracy: float | None
    """The best measured top-1 accuracy; None when no epoch finished."""
    reported: float | None
    """What the search ranks the trial by: the best of the measured and the extrapolated accuracy."""
    cut: bool
    """The run's deadline stopped it."""


def predict_accuracy(accuracies: list[float], epoch: int) -> float | None:
    """AIPerf's extrapolation (utils.predict_acc): fit a·log2(x + b) + c to the epochs' accuracies
    plus its anchor point (120, 0.75), predict epoch `epoch`, take 2 RMS errors off; None where the
    fit fails or the prediction is below the best measured or above 1 (AIPerf then keeps the best)."""
    import numpy as np
    from scipy.optimize import curve_fit

    def logfun(x: Any, a: float, b: float, c: float) -> Any:
        return a * np.log2(np.asarray(x, dtype=float) + b) + c

    xs = [*range(1, len(accuracies) + 1), 120]
    ys = [*accuracies, 0.75]
    try:
        with np.errstate(all="ignore"):
            popt, _ = curve_fit(logfun, xs, ys, maxfev=100000)
            fitted = logfun(xs, *popt)
            error = float(np.sqrt(np.sum(np.square(np.subtract(ys, fitted))) / len(fitted)))
            predicted = float(logfun(epoch, *popt)) - 2 * error
    except (RuntimeError, ValueError, TypeError):
        return None
    if not math.isfinite(predicted) or predicted < max(accuracies) or predicted > 1:
        return None
    return predicted


def append_epoch(path: Path, record: dict[str, Any]) -> None:
    """One JSON line a finished epoch, flushed to the shared file system before the next begins; a
    node killed mid-line leaves a torn last line, which the scorer skips."""
    line = json.dumps(record) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def run_trial(
    plan: TrialPlan,
    model: torch.nn.Module,
    loaders: tuple[Any, Any],
    cfg: AIPerfConfig,
    group: NodeGroup,
    deadline: float,
    log_path: Path,
    say: Callable[[str], None] = print,
) -> TrialOutcome:
    """Train `model` (built for `plan`) up to its budget, stopping early, or at the deadline."""
    train, val = loaders
    model = model.to(group.device)
    net: torch.nn.Module = model
    if group.distributed:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[group.device.index] if group.device.type == "cuda" else None)
    opt_cfg = cfg.optimizer
    steps = max(1, len(train)) * plan.budget
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=opt_cfg.base_learning_rate * plan.batch_size / opt_cfg.base_batch_size,
        momentum=opt_cfg.momentum,
        nesterov=True,
        weight_decay=opt_cfg.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=group.device.type == "cuda")
    accuracies: list[float] = []
    since_best = 0
    for epoch in range(1, plan.budget + 1):
        if hasattr(train.sampler, "set_epoch"):
            train.sampler.set_epoch(plan.number * 1000 + epoch)
        net.train()
        for images, labels in train:
            if group.any(time.time() >= deadline):
                return _outcome(accuracies, cfg, cut=True)
            images = images.to(group.device, non_blocking=True)
            labels = labels.to(group.device, non_blocking=True)
            with autocast:
                loss = F.cross_entropy(net(images), labels, label_smoothing=opt_cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        accuracy = evaluate(model, val, group)
        if group.any(time.time() >= deadline):  # the epoch ended after the run did: it does not count
            return _outcome(accuracies, cfg, cut=True)
        accuracies.append(accuracy)
        if group.leads:
            append_epoch(
                log_path,
                {"trial": plan.number, "round": plan.round, "epoch": epoch, "time": time.time(),
                 "accuracy": accuracy, "node": group.host, "node_index": group.node},
            )
            say(f"node {group.node} trial {plan.number} (arch {plan.arch}.{plan.round}) "
                f"epoch {epoch}/{plan.budget}: top-1 {accuracy:.4f}")
        # AIPerf's EarlyStopping: only a strictly better accuracy resets the count
        since_best = 0 if accuracy > max(accuracies[:-1], default=-1.0) else since_best + 1
        if since_best >= plan.patience:
            break
    return _outcome(accuracies, cfg, cut=False)


def _outcome(accuracies: list[float], cfg: AIPerfConfig, cut: bool) -> TrialOutcome:
    if not accuracies:
        return TrialOutcome(epochs=0, best_accuracy=None, reported=None, cut=cut)
    best = max(accuracies)
    reported = best
    if cfg.search.predict_min_epochs <= len(accuracies) < 80:
        predicted = predict_accuracy(accuracies, cfg.search.predict_epoch)
        if predicted is not None:
            reported = max(best, predicted)
    return TrialOutcome(epochs=len(accuracies), best_accuracy=best, reported=reported, cut=cut)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Any, group: NodeGroup) -> float:
    """Top-1 accuracy over the whole validation set: each rank its shard, the counts summed."""
    model.eval()
    correct = seen = 0
    for images, labels in loader:
        images = images.to(group.device, non_blocking=True)
        labels = labels.to(group.device, non_blocking=True)
        correct += int((model(images).argmax(dim=1) == labels).sum())
        seen += int(labels.numel())
    total_correct, total_seen = group.sum([float(correct), float(seen)])
    return total_correct / total_seen if total_seen else 0.0
