"""The one time-to-train loop every benchmark plugs into.

init -> (stage) -> run_start -> (stage) -> {train an epoch, evaluate, target reached?} -> run_stop

Inside the scored region a training step makes no host sync and no collective beyond DDP's own
gradient all-reduce (none at all on accumulation micro-steps): the loss is checked for NaN/inf on
the device, and the ranks agree on it where they sync anyway, at the end of each epoch (or every
loop.finite_check_interval steps).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlhpc.common import run_events
from mlhpc.common.distributed import DistContext, average_batchnorm_statistics
from mlhpc.common.loop_config import LoopConfig
from mlhpc.common.mllogger import MLLog, constants
from mlhpc.common.progress import SILENT, Progress, staging_line
from mlhpc.common.registry import Benchmark, DataBundle
from mlhpc.common.seeding import seed_everything
from mlhpc.common.timing import Breakdown, PhaseTimer
from mlhpc.common.vocabulary import Division, Status

__all__ = ["LoopConfig", "RunResult", "StagedData", "SubmissionInfo", "init_events", "train_to_target"]

_MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}
_INPUT_DIMS = {"channels_last": 4, "channels_last_3d": 5}
"""The tensors a memory format applies to: NCHW batches for channels_last, NCDHW for _3d."""


@dataclass(frozen=True, kw_only=True)
class SubmissionInfo:
    """The submission_* keys every MLLOG file carries."""

    org: str
    division: Division = "closed"
    status: Status = "onprem"
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
    progress: Progress = SILENT,
) -> RunResult:
    """Train `bench` from scratch until its target, logging every MLLOG event the rules require
    (and a line per epoch to `progress`, for a person watching)."""
    loop: LoopConfig = cfg.loop
    timer = PhaseTimer(
        sync=torch.cuda.synchronize if ctx.device.type == "cuda" and loop.sync_timing else None
    )
    memory_format = resolve_memory_format(loop, bench, ctx.device)

    log.event(constants.CACHE_CLEAR, value=_clear_page_cache(ctx) if clear_cache else False)
    init_started = time.perf_counter()
    with run_events.init(log), timer.phase("init"):
        for key, value in init_events(bench, cfg, ctx, submission, seed):
            log.event(key, value)
        seed_everything(seed)
        raw_model = bench.build_model(cfg).to(ctx.device, memory_format=_MEMORY_FORMATS[memory_format])
        if loop.compile:
            raw_model.compile()  # in place: parameter names and DDP's view of them stay as they are
        model = ctx.wrap_model(raw_model)
    staged = None if staging_inside_run else _stage(stage, log, timer, progress)
    with timer.phase("communication"):
        ctx.barrier()

    run_started = time.perf_counter()
    init_seconds = run_started - init_started
    training: _Training | None = None
    metrics: list[float] = []
    epoch = 0
    error: str | None = None
    with run_events.run(log) as run_stop:
        try:
            staged = staged or _stage(stage, log, timer, progress)
            with timer.phase("setup"):
                data = bench.build_data(cfg, staged.path, ctx, seed)
                log.event(constants.TRAIN_SAMPLES, data.train_samples)
                log.event(constants.EVAL_SAMPLES, data.eval_samples)
                # The schedules count optimizer steps, not micro-batches.
                steps_per_epoch = _len(data.train) // loop.gradient_accumulation_steps
                optimizer, scheduler = bench.build_optimizer(cfg, model, ctx, steps_per_epoch)
                optimizer = ctx.wrap_optimizer(optimizer, model, loop.gradient_accumulation_steps)
            training = _Training(
                bench=bench,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                data=data,
                ctx=ctx,
                loop=loop,
                timer=timer,
                memory_format=memory_format,
                steps_per_epoch=steps_per_epoch,
            )
            for epoch in range(1, loop.max_epochs + 1):
                if data.set_epoch is not None:
                    data.set_epoch(epoch)
                with run_events.epoch(log, epoch):
                    samples_per_s = training.train_epoch(epoch)
                log.event("tracked_stats", {"throughput": samples_per_s}, {constants.EPOCH_NUM: epoch})
                with run_events.evaluation(log, epoch), timer.phase("evaluation"):
                    metric = training.evaluate()
                log.event(bench.target.metric, metric, {constants.EPOCH_NUM: epoch})
                metrics.append(metric)
                elapsed = time.perf_counter() - run_started
                progress.epoch(
                    epoch, loop.max_epochs, bench.target, loop.target, metric, samples_per_s, elapsed
                )
                if not math.isfinite(metric):
                    raise _Abort(f"{bench.target.metric} is {metric} at epoch {epoch}")
                if loop.mode == "target" and bench.target.reached(metric, loop.target):
                    break
            else:
                # fixed_epochs: every epoch trained, and the quality reached is the result.
                if loop.mode == "target":
                    raise _Abort(
                        f"{bench.target.metric} {metrics[-1]:.4f} did not reach the target {loop.target} "
                        f"in loop.max_epochs={loop.max_epochs}; raise it or check the learning rate"
                    )
        except _Abort as abort:
            error = str(abort)
        stats = training.stats if training is not None else _TrainStats()
        with timer.phase("communication"):
            samples_seen, achieved = _global_flops(stats, timer, ctx)
        result = RunResult(
            status=constants.SUCCESS if error is None else constants.ABORTED,
            epochs=epoch,
            metrics=metrics,
            run_seconds=time.perf_counter() - run_started,
            train_samples_per_s=stats.last_samples_per_s,
            flops_per_sample=stats.flops_per_sample,
            achieved_flops_per_s=achieved,
            error=error,
        )
        if bench.run_end_events is not None:
            for key, value in bench.run_end_events(cfg, result).items():
                log.event(key, value)
        run_stop.update({constants.STATUS: result.status, constants.EPOCH_NUM: epoch})
    result.run_seconds = time.perf_counter() - run_started
    result.breakdown = Breakdown(
        seconds=dict(timer.seconds),
        time_to_train_s=result.run_seconds,
        init_s=init_seconds,
        flops_per_sample=stats.flops_per_sample,
        achieved_flops_per_s=achieved,
        train_samples_seen=samples_seen,
        settings={
            "device": ctx.device.type,
            "precision": loop.precision,
            "compile": loop.compile,
            "memory_format": memory_format,
            "loader": training.data.loader if training is not None else None,
            "gradient_accumulation_steps": loop.gradient_accumulation_steps,
            "finite_check_interval": loop.finite_check_interval,
            "sync_timing": loop.sync_timing,
        },
    )
    return result


@dataclass
class _TrainStats:
    """This rank's training work over all epochs, for the achieved FLOP/s."""

    samples: int = 0
    flops_per_sample: float = 0.0
    counted: bool = False
    last_samples_per_s: float = 0.0


@dataclass(kw_only=True)
class _Training:
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
    stats: _TrainStats = field(default_factory=_TrainStats)

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
        loss_check = _FiniteLoss(self.ctx.device)
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
        optimizer.zero_grad(set_to_none=True)
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


class _FiniteLoss:
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
            raise _Abort(
                f"non-finite loss at epoch {epoch} step {int(-minus_step)}; "
                "lower the learning rate or check the data"
            )


def resolve_memory_format(loop: LoopConfig, bench: Benchmark, device: torch.device) -> str:
    """loop.memory_format, with auto meaning the benchmark's GPU layout on a GPU, contiguous elsewhere."""
    if loop.memory_format != "auto":
        return loop.memory_format
    return bench.memory_format if device.type == "cuda" else "contiguous"


def init_events(
    bench: Benchmark, cfg: Any, ctx: DistContext, submission: SubmissionInfo, seed: int
) -> list[tuple[str, Any]]:
    """The MLLOG events between init_start and init_stop: the submission, the seed, the scale and
    the benchmark's hyperparameters (what `mlhpc run --dry-run` prints)."""
    return [
        (constants.SUBMISSION_BENCHMARK, bench.name),
        (constants.SUBMISSION_ORG, submission.org),
        (constants.SUBMISSION_DIVISION, submission.division),
        (constants.SUBMISSION_STATUS, submission.status),
        (constants.SUBMISSION_PLATFORM, submission.platform),
        (constants.SEED, seed),
        ("number_of_nodes", ctx.num_nodes),
        ("accelerators_per_node", ctx.local_world_size if ctx.device.type == "cuda" else 0),
        *bench.hyperparameters(cfg, ctx).items(),
    ]


def _stage(stage: Callable[[], StagedData], log: MLLog, timer: PhaseTimer, progress: Progress) -> StagedData:
    with run_events.staging(log) as stop_metadata, timer.phase("staging"):
        staged = stage()
        stop_metadata.update(staged.metadata)
    progress.say(staging_line(staged.metadata))
    return staged


def _global_flops(stats: _TrainStats, timer: PhaseTimer, ctx: DistContext) -> tuple[int, float]:
    """(training samples over all ranks, FLOP/s over forward + backward time summed over ranks)."""
    compute_s = timer.seconds["forward"] + timer.seconds["backward"]
    rank_rate = stats.samples * stats.flops_per_sample / compute_s if compute_s > 0 else 0.0
    totals = ctx.all_reduce_sum(torch.tensor([float(stats.samples), rank_rate], device=ctx.device))
    samples, rate = totals.tolist()
    return int(samples), float(rate)


def to_device(batch: Any, device: torch.device, memory_format: str = "contiguous") -> Any:
    """Move tensors inside lists, tuples and dicts to `device`; the model's inputs (4D or 5D for the
    channels-last formats) in `memory_format`."""
    if torch.is_tensor(batch):
        batch = batch.to(device, non_blocking=True)
        if batch.dim() == _INPUT_DIMS.get(memory_format):
            batch = batch.contiguous(memory_format=_MEMORY_FORMATS[memory_format])
        return batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, memory_format) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, memory_format) for k, v in batch.items()}
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
