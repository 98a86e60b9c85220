"""The one time-to-train loop every benchmark plugs into.

init -> (stage) -> run_start -> (stage) -> setup -> {train an epoch, evaluate, target reached?} -> run_stop

Inside the scored region a training step makes no host sync and no collective beyond DDP's own
gradient all-reduce (none at all on accumulation micro-steps): the loss is checked for NaN/inf on
the device, and the ranks agree on it where they sync anyway, at the end of each epoch (or every
loop.finite_check_interval steps); the step itself is in common/training/epoch.py.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.cluster.termination import worker_death_is_one_error
from mlhpc.common.contract.registry import Benchmark
from mlhpc.common.training import run_events
from mlhpc.common.training.batches import MEMORY_FORMATS
from mlhpc.common.training.epoch import Aborted, Training, global_flops
from mlhpc.common.training.loop_config import LoopConfig
from mlhpc.common.training.mllogger import MLLog, constants
from mlhpc.common.training.progress import SILENT, Progress
from mlhpc.common.training.seeding import seed_everything
from mlhpc.common.training.staged import StagedData, Staging, StartStaging, stage_now, staged_data
from mlhpc.common.training.timing import Breakdown, PhaseTimer
from mlhpc.common.vocabulary import DEFAULT_STAGING, Division, Status
from mlhpc.common.vocabulary import Staging as Where

__all__ = [
    "LoopConfig",
    "RunResult",
    "StagedData",
    "StartStaging",
    "SubmissionInfo",
    "init_events",
    "resolve_memory_format",
    "train_to_target",
]


@dataclass(frozen=True, kw_only=True)
class SubmissionInfo:
    """The submission_* keys every MLLOG file carries (MLPerf names two of them submission_org and
    submission_platform: mlhpc's submitter and system)."""

    submitter: str
    division: Division = "closed"
    status: Status = "onprem"
    system: str


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
    train_samples: int = 0
    """Training samples an epoch over all ranks (the logged train_samples), for HPC AI500's FLOPS."""
    breakdown: Breakdown | None = None
    error: str | None = None


def train_to_target(
    bench: Benchmark,
    cfg: Any,
    ctx: DistContext,
    log: MLLog,
    *,
    seed: int,
    submission: SubmissionInfo,
    stage: Callable[[], StagedData],
    staging: Where = DEFAULT_STAGING,
    start_staging: StartStaging | None = None,
    clear_cache: bool = False,
    progress: Progress = SILENT,
) -> RunResult:
    """Train `bench` from scratch until its target, logging every MLLOG event the rules require
    (and a line per epoch to `progress`, for a person watching). `staging`: before run_start,
    inside the run before training, or overlapping training (`start_staging` starts it)."""
    loop: LoopConfig = cfg.loop
    timer = PhaseTimer(
        sync=torch.cuda.synchronize if ctx.device.type == "cuda" and loop.sync_timing else None
    )
    memory_format = resolve_memory_format(loop, bench, ctx.device)

    log.event(constants.CACHE_CLEAR, value=_clear_page_cache(ctx) if clear_cache else False)
    init_started = time.perf_counter()
    model = _init(bench, cfg, ctx, log, timer, seed=seed, submission=submission, memory_format=memory_format)
    staged_before = stage_now(stage, log, timer, progress) if staging == "before" else None
    with timer.phase("communication"):
        ctx.barrier()

    run_started = time.perf_counter()
    # A worker the OOM killer took is one error (the CLI's resume line), not torch's RuntimeError.
    with worker_death_is_one_error(), run_events.run(log) as run_stop:
        with staged_data(
            staging, stage, start_staging, staged_before, log=log, timer=timer, progress=progress, ctx=ctx
        ) as data:
            # the first seed's optimizer imports torch._dynamo: 2 s idle, 10 s busy, said when slow
            with progress.say_if_slow("setting up the optimizer and the data loaders"):
                training = _setup(
                    bench, cfg, ctx, log, timer, model, data, seed=seed, memory_format=memory_format
                )
            epochs = _train_epochs(training, log, progress, run_started, data)
        result, samples_seen = _finish(training, cfg, log, epochs, run_started)
        run_stop.update({constants.STATUS: result.status, constants.EPOCH_NUM: epochs.number})
    result.run_seconds = time.perf_counter() - run_started
    result.breakdown = _breakdown(
        training, result, init_s=run_started - init_started, samples_seen=samples_seen, staging=data
    )
    return result


def _init(
    bench: Benchmark,
    cfg: Any,
    ctx: DistContext,
    log: MLLog,
    timer: PhaseTimer,
    *,
    seed: int,
    submission: SubmissionInfo,
    memory_format: str,
) -> torch.nn.Module:
    """init_start .. init_stop: the submission and hyperparameters logged, the seed set, and this
    rank's model built (compiled if asked) and wrapped for data parallelism."""
    with run_events.init(log), timer.phase("init"):
        for key, value in init_events(bench, cfg, ctx, submission, seed):
            log.event(key, value)
        seed_everything(seed)
        raw_model = bench.build_model(cfg).to(ctx.device, memory_format=MEMORY_FORMATS[memory_format])
        if cfg.loop.compile:
            raw_model.compile()  # in place: parameter names and DDP's view of them stay as they are
        return ctx.wrap_model(raw_model)


def _setup(
    bench: Benchmark,
    cfg: Any,
    ctx: DistContext,
    log: MLLog,
    timer: PhaseTimer,
    model: torch.nn.Module,
    data: Staging,
    *,
    seed: int,
    memory_format: str,
) -> Training:
    """Inside the run: the loaders over the staged data (their sample counts logged), the optimizer
    and its schedule."""
    loop: LoopConfig = cfg.loop
    with timer.phase("setup"):
        loaders = bench.build_data(cfg, data.data_path, ctx, seed)
        data.loaders_built(loaders, ctx)  # an overlapped staging then copies in reading order
        log.event(constants.TRAIN_SAMPLES, loaders.train_samples)
        log.event(constants.EVAL_SAMPLES, loaders.eval_samples)
        # The schedules count optimizer steps, not micro-batches.
        steps_per_epoch = _len(loaders.train) // loop.gradient_accumulation_steps
        optimizer, scheduler = bench.build_optimizer(cfg, model, ctx, steps_per_epoch)
        optimizer = ctx.wrap_optimizer(optimizer, model, loop.gradient_accumulation_steps)
    return Training(
        bench=bench,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=loaders,
        ctx=ctx,
        loop=loop,
        timer=timer,
        memory_format=memory_format,
        steps_per_epoch=steps_per_epoch,
    )


@dataclass
class _Epochs:
    """How far the epochs got: the one last started, each evaluated metric, why the run aborted."""

    number: int = 0
    metrics: list[float] = field(default_factory=list)
    error: str | None = None


def _train_epochs(
    training: Training, log: MLLog, progress: Progress, run_started: float, staging: Staging
) -> _Epochs:
    """{train an epoch, evaluate, target reached?} until the target (mode target) or for every
    epoch (mode fixed_epochs); an abort ends them with its reason in the result. A staging that
    overlaps training and failed stops it at the end of an epoch (`Staging.check`)."""
    bench, loop, data, timer = training.bench, training.loop, training.data, training.timer
    epochs = _Epochs()
    try:
        for epoch in range(1, loop.max_epochs + 1):
            epochs.number = epoch
            if data.set_epoch is not None:
                data.set_epoch(epoch)
            with progress.heartbeat(f"epoch {epoch:>2}/{loop.max_epochs}"):  # a long epoch is not silent
                with run_events.epoch(log, epoch):
                    samples_per_s = training.train_epoch(epoch)
                log.event("tracked_stats", {"throughput": samples_per_s}, {constants.EPOCH_NUM: epoch})
                with run_events.evaluation(log, epoch), timer.phase("evaluation"):
                    metric = training.evaluate()
            log.event(bench.target.metric, metric, {constants.EPOCH_NUM: epoch})
            staging.check(training.ctx)
            epochs.metrics.append(metric)
            elapsed = time.perf_counter() - run_started
            progress.epoch(epoch, loop.max_epochs, bench.target, loop.target, metric, samples_per_s, elapsed)
            if not math.isfinite(metric):
                raise Aborted(f"{bench.target.metric} is {metric} at epoch {epoch}")
            if loop.mode == "target" and bench.target.reached(metric, loop.target):
                return epochs
        # fixed_epochs: every epoch trained, and the quality reached is the result.
        if loop.mode == "target":
            raise Aborted(
                f"{bench.target.metric} {epochs.metrics[-1]:.4f} did not reach the target {loop.target} "
                f"in loop.max_epochs={loop.max_epochs}; raise it or check the learning rate"
            )
    except Aborted as abort:
        epochs.error = str(abort)
    return epochs


def _finish(
    training: Training, cfg: Any, log: MLLog, epochs: _Epochs, run_started: float
) -> tuple[RunResult, int]:
    """Before run_stop: the result, the training FLOP/s over all ranks and the benchmark's own end
    events; returns the result and the training samples seen over all ranks."""
    stats = training.stats
    with training.timer.phase("communication"):
        samples_seen, achieved = global_flops(stats, training.timer, training.ctx)
    result = RunResult(
        status=constants.SUCCESS if epochs.error is None else constants.ABORTED,
        epochs=epochs.number,
        metrics=epochs.metrics,
        run_seconds=time.perf_counter() - run_started,
        train_samples_per_s=stats.last_samples_per_s,
        flops_per_sample=stats.flops_per_sample,
        achieved_flops_per_s=achieved,
        train_samples=training.data.train_samples,
        error=epochs.error,
    )
    if training.bench.run_end_events is not None:
        for key, value in training.bench.run_end_events(cfg, result).items():
            log.event(key, value)
    return result, samples_seen


def _breakdown(
    training: Training, result: RunResult, *, init_s: float, samples_seen: int, staging: Staging
) -> Breakdown:
    """Where the run's time went, and the settings that decide it."""
    loop = training.loop
    return Breakdown(
        seconds=dict(training.timer.seconds),
        time_to_train_s=result.run_seconds,
        init_s=init_s,
        flops_per_sample=result.flops_per_sample,
        achieved_flops_per_s=result.achieved_flops_per_s,
        train_samples_seen=samples_seen,
        overlapped_staging=dict(staging.overlap),
        settings={
            "device": training.ctx.device.type,
            "precision": loop.precision,
            "compile": loop.compile,
            "memory_format": training.memory_format,
            "loader": training.data.loader,
            "gradient_accumulation_steps": loop.gradient_accumulation_steps,
            "finite_check_interval": loop.finite_check_interval,
            "sync_timing": loop.sync_timing,
        },
    )


def resolve_memory_format(loop: LoopConfig, bench: Benchmark, device: torch.device) -> str:
    """loop.memory_format, with auto meaning the benchmark's layout for the device: its GPU layout on
    a GPU, its CPU layout on a CPU, contiguous elsewhere."""
    if loop.memory_format != "auto":
        return loop.memory_format
    by_device = {"cuda": bench.memory_format, "cpu": bench.cpu_memory_format}
    return by_device.get(device.type, "contiguous")


def init_events(
    bench: Benchmark, cfg: Any, ctx: DistContext, submission: SubmissionInfo, seed: int
) -> list[tuple[str, Any]]:
    """The MLLOG events between init_start and init_stop: the submission, the seed, the scale and
    the benchmark's hyperparameters (what `mlhpc run --dry-run` prints)."""
    return [
        (constants.SUBMISSION_BENCHMARK, bench.name),
        (constants.SUBMISSION_ORG, submission.submitter),
        (constants.SUBMISSION_DIVISION, submission.division),
        (constants.SUBMISSION_STATUS, submission.status),
        (constants.SUBMISSION_PLATFORM, submission.system),
        (constants.SEED, seed),
        ("number_of_nodes", ctx.num_nodes),
        ("accelerators_per_node", ctx.local_world_size if ctx.device.type == "cuda" else 0),
        *bench.hyperparameters(cfg, ctx).items(),
    ]


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
