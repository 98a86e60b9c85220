"""The one time-to-train loop every benchmark plugs into.

init -> (stage) -> run_start -> (stage) -> {train an epoch, evaluate, target reached?} -> run_stop
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlhpc.common.distributed import DistContext
from mlhpc.common.mllogger import MLLog, constants
from mlhpc.common.registry import Benchmark, DataBundle
from mlhpc.common.seeding import seed_everything
from mlhpc.common.timing import Breakdown, PhaseTimer


@dataclass(kw_only=True, frozen=True)
class LoopConfig:
    """Settings of the shared loop; every benchmark config has one as its `loop` section."""

    global_batch_size: int
    """Samples per optimizer step over all ranks."""
    max_epochs: int
    """Stop with status aborted if the target is not reached by this epoch."""
    target: float
    """Quality target of the benchmark's metric (e.g. MAE 0.124 for CosmoFlow)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed before each optimizer step."""
    amp: bool = False
    """Mixed precision (CUDA only; ignored on CPU)."""
    sync_timing: bool = True
    """On a GPU, synchronize at every phase boundary of the time breakdown, so that each phase is
    charged its own kernels (exact, costs a few percent); false: phases time kernel launches."""

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"loop.global_batch_size={self.global_batch_size} must be positive")
        if self.max_epochs <= 0:
            raise ValueError(f"loop.max_epochs={self.max_epochs} must be positive")
        if self.gradient_accumulation_steps <= 0:
            raise ValueError("loop.gradient_accumulation_steps must be at least 1")

    def local_batch_size(self, world_size: int) -> int:
        """Per-rank micro-batch; the global batch must split evenly over ranks and micro-batches."""
        parts = world_size * self.gradient_accumulation_steps
        if self.global_batch_size % parts:
            raise ValueError(
                f"loop.global_batch_size={self.global_batch_size} is not divisible by "
                f"world_size x gradient_accumulation_steps={parts}; pick a multiple of {parts}"
            )
        return self.global_batch_size // parts


@dataclass(frozen=True, kw_only=True)
class SubmissionInfo:
    """The submission_* keys every MLLOG file carries."""

    org: str
    division: Literal["closed", "open"] = "closed"
    status: Literal["onprem", "cloud", "preview", "research"] = "onprem"
    platform: str


@dataclass(frozen=True, kw_only=True)
class StagedData:
    """Where staging put the dataset, and what it reports into staging_stop's metadata."""

    path: Path
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class RunResult:
    """How one seeded run ended."""

    status: Literal["success", "aborted"]
    epochs: int
    metrics: list[float]
    run_seconds: float
    train_samples_per_s: float
    flops_per_sample: float = 0.0
    """Forward + backward FLOPs of one training sample (torch.utils.flop_counter, first step)."""
    achieved_flops_per_s: float = 0.0
    """Training FLOPs over forward + backward seconds, summed over ranks."""
    breakdown: Breakdown | None = None
    error: str | None = None


class _Abort(Exception):
    """Internal: end the run with status aborted and this message."""


def train_to_target(
    bench: Benchmark,
    cfg: Any,
    ctx: DistContext,
    log: MLLog,
    *,
    seed: int,
    submission: SubmissionInfo,
    stage: Callable[[], StagedData],
    staging_inside_run: bool = True,
    clear_cache: bool = False,
) -> RunResult:
    """Train `bench` from scratch until its target, logging every MLLOG event the rules require."""
    loop: LoopConfig = cfg.loop
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" and loop.sync_timing else None
    timer = PhaseTimer(sync=sync)
    log.event(constants.CACHE_CLEAR, value=_clear_page_cache(ctx) if clear_cache else False)
    init_started = time.perf_counter()
    log.start(constants.INIT_START)
    log.event(constants.SUBMISSION_BENCHMARK, bench.name)
    log.event(constants.SUBMISSION_ORG, submission.org)
    log.event(constants.SUBMISSION_DIVISION, submission.division)
    log.event(constants.SUBMISSION_STATUS, submission.status)
    log.event(constants.SUBMISSION_PLATFORM, submission.platform)
    log.event(constants.SEED, seed)
    log.event("number_of_nodes", ctx.num_nodes)
    log.event("accelerators_per_node", ctx.local_world_size if ctx.device.type == "cuda" else 0)
    with timer.phase("init"):
        seed_everything(seed)
        model = ctx.wrap_model(bench.build_model(cfg).to(ctx.device))
        for key, value in bench.hyperparameters(cfg, ctx).items():
            log.event(key, value)
    log.end(constants.INIT_STOP)

    staged = _stage(stage, log, timer) if not staging_inside_run else None
    with timer.phase("communication"):
        ctx.barrier()
    log.start(constants.RUN_START)
    run_started = time.perf_counter()
    init_seconds = run_started - init_started
    metrics: list[float] = []
    samples_per_s = 0.0
    epoch = 0
    in_epoch = False
    error: str | None = None
    stats = _TrainStats()
    try:
        staged = staged or _stage(stage, log, timer)
        with timer.phase("setup"):
            data = bench.build_data(cfg, staged.path, ctx, seed)
            log.event(constants.TRAIN_SAMPLES, data.train_samples)
            log.event(constants.EVAL_SAMPLES, data.eval_samples)
            optimizer, scheduler = bench.build_optimizer(cfg, model, ctx, _len(data.train))
            optimizer = ctx.wrap_optimizer(optimizer, model)
        for epoch in range(1, loop.max_epochs + 1):
            if data.set_epoch is not None:
                data.set_epoch(epoch)
            log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: epoch})
            in_epoch = True
            samples_per_s = _train_epoch(
                bench, model, optimizer, scheduler, data, ctx, loop, epoch, timer, stats
            )
            in_epoch = False
            log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch})
            log.event("tracked_stats", {"throughput": samples_per_s}, {constants.EPOCH_NUM: epoch})
            log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})
            with timer.phase("evaluation"):
                metric = _evaluate(bench, model, data, ctx)
            log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})
            log.event(bench.target.metric, metric, {constants.EPOCH_NUM: epoch})
            metrics.append(metric)
            if not math.isfinite(metric):
                raise _Abort(f"{bench.target.metric} is {metric} at epoch {epoch}")
            if bench.target.reached(metric, loop.target):
                break
        else:
            raise _Abort(
                f"{bench.target.metric} {metrics[-1]:.4f} did not reach the target {loop.target} "
                f"in loop.max_epochs={loop.max_epochs}; raise it or check the learning rate"
            )
    except _Abort as abort:
        if in_epoch:  # close the interval so the aborted log stays well-formed
            log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch})
        error = str(abort)
    with timer.phase("communication"):
        samples_seen, achieved = _global_flops(stats, timer, ctx)
    status = constants.SUCCESS if error is None else constants.ABORTED
    result = RunResult(
        status=status,
        epochs=epoch,
        metrics=metrics,
        run_seconds=time.perf_counter() - run_started,
        train_samples_per_s=samples_per_s,
        flops_per_sample=stats.flops_per_sample,
        achieved_flops_per_s=achieved,
        error=error,
    )
    if bench.run_end_events is not None:
        for key, value in bench.run_end_events(cfg, result).items():
            log.event(key, value)
    log.end(constants.RUN_STOP, metadata={constants.STATUS: status, constants.EPOCH_NUM: epoch})
    result.run_seconds = time.perf_counter() - run_started
    result.breakdown = Breakdown(
        seconds=dict(timer.seconds),
        time_to_train_s=result.run_seconds,
        init_s=init_seconds,
        flops_per_sample=stats.flops_per_sample,
        achieved_flops_per_s=achieved,
        train_samples_seen=samples_seen,
    )
    return result


@dataclass
class _TrainStats:
    """This rank's training work over all epochs, for the achieved FLOP/s."""

    samples: int = 0
    flops_per_sample: float = 0.0
    counted: bool = False


def _global_flops(stats: _TrainStats, timer: PhaseTimer, ctx: DistContext) -> tuple[int, float]:
    """(training samples over all ranks, FLOP/s over forward + backward time summed over ranks)."""
    compute_s = timer.seconds["forward"] + timer.seconds["backward"]
    rank_rate = stats.samples * stats.flops_per_sample / compute_s if compute_s > 0 else 0.0
    totals = ctx.all_reduce_sum(torch.tensor([float(stats.samples), rank_rate], device=ctx.device))
    return int(totals[0].item()), float(totals[1].item())


def _stage(stage: Callable[[], StagedData], log: MLLog, timer: PhaseTimer) -> StagedData:
    log.start(constants.STAGING_START)
    with timer.phase("staging"):
        staged = stage()
    log.end(constants.STAGING_STOP, metadata=staged.metadata)
    return staged


def _train_epoch(
    bench: Benchmark,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    data: DataBundle,
    ctx: DistContext,
    loop: LoopConfig,
    epoch: int,
    timer: PhaseTimer,
    stats: _TrainStats,
) -> float:
    """One pass over this rank's shard; returns global training samples per second."""
    model.train()
    use_amp = loop.amp and ctx.device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda") if use_amp else None
    accumulate = loop.gradient_accumulation_steps
    started = time.perf_counter()
    samples = 0
    optimizer.zero_grad(set_to_none=True)
    for step, batch in enumerate(timer.timed_iter(data.train)):
        with timer.phase("data_wait"):
            batch = to_device(batch, ctx.device)
        size = batch_size(batch)
        # The first step of the run runs under the FLOP counter: forward and backward.
        counter = FlopCounterMode(display=False) if not stats.counted else None
        with counter or contextlib.nullcontext():
            autocast = torch.autocast("cuda", dtype=torch.float16) if use_amp else contextlib.nullcontext()
            with timer.phase("forward"), autocast:
                loss = bench.compute_loss(model, batch) / accumulate
            with timer.phase("communication"):
                _check_finite(loss, ctx, epoch, step)
            with timer.phase("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
        if counter is not None:
            stats.flops_per_sample = counter.get_total_flops() / max(size, 1)
            stats.counted = True
        samples += size
        if (step + 1) % accumulate == 0:
            with timer.phase("optimizer"):
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
    stats.samples += samples
    with timer.phase("communication"):
        total = ctx.all_reduce_sum(torch.tensor([float(samples)], device=ctx.device)).item()
    return total / max(time.perf_counter() - started, 1e-9)


def _evaluate(bench: Benchmark, model: torch.nn.Module, data: DataBundle, ctx: DistContext) -> float:
    model.eval()
    with torch.no_grad():
        return float(bench.evaluate(model, data.validation, ctx))


def _check_finite(loss: torch.Tensor, ctx: DistContext, epoch: int, step: int) -> None:
    # Every rank must agree to stop, or the others would wait forever in the next all-reduce.
    bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=ctx.device)
    if ctx.all_reduce_sum(bad).item() > 0:
        raise _Abort(
            f"non-finite loss at epoch {epoch} step {step}; lower the learning rate or check the data"
        )


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors inside lists, tuples and dicts to `device`."""
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor, or the length of its first list."""
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if torch.is_tensor(first) else len(first)


def _len(loader: Any) -> int:
    try:
        return len(loader)
    except TypeError:
        return 0


def _clear_page_cache(ctx: DistContext) -> bool:
    """Drop the page cache once per node (needs root); True if it was dropped."""
    if ctx.local_rank != 0:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False
