"""One epoch of training and one evaluation, for the loop: the step (no host sync, no collective
beyond DDP's gradient all-reduce), the device-side NaN/inf check the ranks agree on, and the counts
behind the achieved FLOP/s."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlhpc.common.cluster.distributed import DistContext, average_batchnorm_statistics
from mlhpc.common.contract.registry import Benchmark, DataBundle
from mlhpc.common.training.batches import batch_size, to_device
from mlhpc.common.training.loop_config import LoopConfig
from mlhpc.common.training.timing import PhaseTimer


class Aborted(Exception):
    """End the run with status aborted and this message."""


@dataclass
class TrainStats:
    """This rank's training work over all epochs, for the achieved FLOP/s."""

    samples: int = 0
    flops_per_sample: float = 0.0
    counted: bool = False
    last_samples_per_s: float = 0.0


@dataclass(kw_only=True)
class Training:
    """The model, its optimizer and data, and one epoch of training over them."""

    bench: Benchmark
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    data: DataBundle
    ctx: DistContext
    loop: LoopConfig
    timer: PhaseTimer
    memory_format: str
    steps_per_epoch: int
    """Optimizer steps per epoch (0: the loader's length is unknown)."""
    stats: TrainStats = field(default_factory=TrainStats)

    def __post_init__(self) -> None:
        # One scaler for the run: its loss scale carries over from epoch to epoch.
        fp16 = self.loop.precision == "fp16"
        self.scaler = torch.amp.GradScaler(self.ctx.device.type) if fp16 else None
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.loop.precision)

    def train_epoch(self, epoch: int) -> float:
        """One pass over this rank's shard; returns training samples per second over all ranks."""
        model, loop, timer = self.model, self.loop, self.timer
        accumulate = loop.gradient_accumulation_steps
        model.train()
        loss_check = FiniteLoss(self.ctx.device)
        # Whole accumulation groups only: a leftover micro-batch would add its gradient to the next
        # step. It is still drawn, so that every loader (DALI's too) sees whole epochs.
        micro_steps = self.steps_per_epoch * accumulate if self.steps_per_epoch else math.inf
        samples = 0
        started = time.perf_counter()
        for step, batch in enumerate(timer.timed_iter(self.data.train)):
            if step >= micro_steps:
                continue
            with timer.phase("data_wait"):
                batch = to_device(batch, self.ctx.device, self.memory_format)
            last_micro_step = (step + 1) % accumulate == 0
            with self._count_flops_once(batch), self._gradient_sync(last_micro_step):
                with timer.phase("forward"), self._autocast():
                    loss = self.bench.compute_loss(model, batch) / accumulate
                loss_check.observe(loss, step)
                with timer.phase("backward"):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            samples += batch_size(batch)
            if last_micro_step:
                with timer.phase("optimizer"):
                    self._optimizer_step()
            if loop.finite_check_interval and (step + 1) % loop.finite_check_interval == 0:
                with timer.phase("communication"):
                    loss_check.agree(self.ctx, epoch)
        with timer.phase("communication"):
            loss_check.agree(self.ctx, epoch)
            total = self.ctx.all_reduce_sum(torch.tensor([float(samples)], device=self.ctx.device))
            total_samples = total.item()
        self.stats.samples += samples
        self.stats.last_samples_per_s = total_samples / max(time.perf_counter() - started, 1e-9)
        return self.stats.last_samples_per_s

    def evaluate(self) -> float:
        # Ranks keep their own batch-norm statistics while training (no buffer broadcast per
        # step); the evaluated model carries their mean, as the DeepCAM reference's does.
        average_batchnorm_statistics(self.model, self.ctx)
        self.model.eval()
        with torch.no_grad(), self._autocast():
            return float(self.bench.evaluate(self.model, self.data.validation, self.ctx))

    def _optimizer_step(self) -> None:
        optimizer = self.optimizer
        if self.scaler is None:
            optimizer.step()
        elif hasattr(optimizer, "skip_synchronize"):
            # Horovod: finish its gradient all-reduce before the scaler unscales the gradients.
            optimizer.synchronize()
            with optimizer.skip_synchronize():
                self.scaler.step(optimizer)
            self.scaler.update()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()
        # set_to_none is torch's default; Horovod's optimizer (0.28) takes no argument.
        optimizer.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.dtype)

    def _gradient_sync(self, last_micro_step: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP all-reduces gradients on the last micro-step of an accumulation group only."""
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if last_micro_step or no_sync is None else no_sync()

    @contextlib.contextmanager
    def _count_flops_once(self, batch: Any) -> Iterator[None]:
        """The run's first step runs under the FLOP counter (eagerly, when the model is compiled)."""
        if self.stats.counted:
            yield
            return
        counter = FlopCounterMode(display=False)
        with contextlib.ExitStack() as stack:
            if self.loop.compile:
                stack.enter_context(torch.compiler.set_stance("force_eager"))
            stack.enter_context(counter)
            yield
        self.stats.flops_per_sample = counter.get_total_flops() / max(batch_size(batch), 1)
        self.stats.counted = True


class FiniteLoss:
    """Remembers, on the device, the first step of an epoch whose loss was NaN or inf."""

    def __init__(self, device: torch.device) -> None:
        self.first_bad_step = torch.full((), -1, dtype=torch.float64, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self.first_bad_step = torch.where(bad & (self.first_bad_step < 0), float(step), self.first_bad_step)

    def agree(self, ctx: DistContext, epoch: int) -> None:
        """One host sync and one collective: every rank stops together, or the others would wait
        forever in the next all-reduce."""
        seen = self.first_bad_step >= 0
        # Max over ranks of (any bad step, minus the earliest bad step).
        verdict = torch.stack([seen.double(), torch.where(seen, -self.first_bad_step, -math.inf)])
        any_bad, minus_step = ctx.all_reduce_max(verdict).tolist()
        if any_bad > 0:
            raise Aborted(
                f"non-finite loss at epoch {epoch} step {int(-minus_step)}; "
                "lower the learning rate or check the data"
            )


def global_flops(stats: TrainStats, timer: PhaseTimer, ctx: DistContext) -> tuple[int, float]:
    """(training samples over all ranks, FLOP/s over forward + backward time summed over ranks)."""
    compute_s = timer.seconds["forward"] + timer.seconds["backward"]
    rank_rate = stats.samples * stats.flops_per_sample / compute_s if compute_s > 0 else 0.0
    totals = ctx.all_reduce_sum(torch.tensor([float(stats.samples), rank_rate], device=ctx.device))
    samples, rate = totals.tolist()
    return int(samples), float(rate)
