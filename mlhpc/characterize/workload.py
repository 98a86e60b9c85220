"""The one thing every timed level measures: a model, its optimizer and its loss, stepped on batches
already on the device. Each step is three labelled phases, so that the profiler's events can be
told apart by the phase they ran in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function

PHASES = ("forward", "backward", "optimizer")
"""The labels (torch.profiler.record_function) of a step's three phases, in order."""


@dataclass
class Workload:
    """A training step's parts: `compute_loss(model, batch)` is the benchmark's own loss."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    compute_loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    batches: Iterator[Any]
    """Batches already on `device` and in the model's memory format; never exhausted by a level
    that takes at most the steps it was given."""
    device: torch.device
    batch_size: int
    """Samples per batch (this rank's)."""

    def step(self) -> torch.Tensor:
        """One training step on the next batch, each phase under its label; returns the loss."""
        batch = next(self.batches)
        self.optimizer.zero_grad(set_to_none=True)
        with record_function(PHASES[0]):
            loss = self.compute_loss(self.model, batch)
        with record_function(PHASES[1]):
            loss.backward()
        with record_function(PHASES[2]):
            self.optimizer.step()
        return loss.detach()

    def synchronize(self) -> None:
        """Wait for the device (a CUDA step returns before its kernels end)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def trainable_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters that train: what one data-parallel gradient all-reduce carries."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of all parameters (frozen ones too) and buffers, as the model holds them."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
