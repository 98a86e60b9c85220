"""`mlhpc run ... --dry-run`: check a run's config (and its data) and print what it would log up
to init_stop, building nothing heavy: a site checks a config on a login node before it queues a
512-node job."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch

from mlhpc.campaign import CAMPAIGN_FILE, SETTING_FLAGS, resolve_settings
from mlhpc.campaign_io import given_settings, read_campaign_file, resolve_config
from mlhpc.common.distributed import DistContext
from mlhpc.common.errors import ConfigError
from mlhpc.common.launch import detect_launch
from mlhpc.common.loop import SubmissionInfo, init_events, resolve_memory_format
from mlhpc.common.mllogger import MLLog, constants
from mlhpc.runner import RunOptions, check_options
from mlhpc.system_desc import stable_system_name


def dry_run(opts: RunOptions, *, device: str = "auto") -> int:
    """Resolve and validate everything a run would before training; print its MLLOG events up to
    init_stop (the first seed's) and a summary. 0 when the run would start; a ConfigError or
    DataError (one line naming the fix) when it would not."""
    check_options(opts)
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    bench, cfg = resolved.benchmark, resolved.cfg
    ctx = _context(device)
    where = Path(opts.out) / CAMPAIGN_FILE
    recorded = read_campaign_file(where)
    settings = resolve_settings(
        given_settings(opts.campaign, {name: getattr(opts, name) for name in SETTING_FLAGS}),
        recorded.settings if recorded else None,
        where,
        default_system=stable_system_name(ctx),
        default_division=resolved.default_division,
    )
    system = settings.system or stable_system_name(ctx)
    if ctx.world_size % opts.instances:
        raise ConfigError(
            f"--instances {opts.instances} does not divide the {ctx.world_size} rank(s); "
            f"launch a multiple of {opts.instances} ranks"
        )
    ranks_per_model = ctx.world_size // opts.instances
    cfg.loop.local_batch_size(ranks_per_model)
    if opts.data is not None:
        bench.validate_dataset(cfg, opts.data)
    submission = SubmissionInfo(
        org=settings.submitter,
        division=settings.division,  # type: ignore[arg-type]
        status=settings.status,  # type: ignore[arg-type]
        platform=system,
    )
    seed = (opts.first_seed or int.from_bytes(os.urandom(3), "little") + 1) + (opts.index or 0)
    model_ctx = replace(
        ctx, world_size=ranks_per_model, num_nodes=max(1, ranks_per_model // ctx.local_world_size)
    )
    log = MLLog(None, enabled=ctx.is_main, echo=True)
    log.event(constants.CACHE_CLEAR, value=opts.clear_cache)
    log.start(constants.INIT_START)
    for key, value in init_events(bench, cfg, model_ctx, submission, seed):
        log.event(key, value)
    log.end(constants.INIT_STOP)
    if ctx.is_main:
        loop = cfg.loop
        runs = f"{opts.instances} instances at once" if opts.instances > 1 else f"{opts.seeds} seed(s)"
        print(
            f"dry run: {bench.name} --config {opts.config}, {runs} on {ranks_per_model} rank(s) each "
            f"(batch {loop.local_batch_size(ranks_per_model)} per rank x {loop.gradient_accumulation_steps} "
            f"micro-batches), {loop.precision}{', compiled' if loop.compile else ''}, memory format "
            f"{resolve_memory_format(loop, bench, ctx.device)}, staging {opts.staging} run_start; "
            f"data {opts.data or 'generated'}; results into {opts.out}/{settings.submitter}/results/{system}. "
            "Nothing was built, staged or written."
        )
    return 0


def _context(device: str) -> DistContext:
    """This process's place in the job from the launcher's environment, without joining a group."""
    launch = detect_launch()
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return DistContext(
        rank=launch.rank,
        local_rank=launch.local_rank,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        num_nodes=launch.num_nodes,
        device=torch.device("cuda" if cuda else "cpu"),
        backend="none",
        launcher=launch.launcher,
    )
