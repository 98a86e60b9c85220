"""`mlhpc run ... --dry-run`: check a run's config (and its data) and print what it would log up
to init_stop, building nothing heavy: a site checks a config on a login node before it queues a
512-node job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from mlhpc.campaign_io import plan_out, resolve_config
from mlhpc.common.distributed import DistContext
from mlhpc.common.errors import ConfigError
from mlhpc.common.launch import detect_launch
from mlhpc.common.loop import SubmissionInfo, init_events, resolve_memory_format
from mlhpc.common.mllogger import MLLog, constants
from mlhpc.run_options import RunOptions, check_planned
from mlhpc.runner import campaign_request, plan_line
from mlhpc.system_desc import stable_system_name


def dry_run(opts: RunOptions) -> int:
    """Resolve and validate everything a run would before training, through the same planner (a
    taken --index, a changed config or a different first seed is refused here as in the run);
    print its MLLOG events up to init_stop (the first run's) and the plan. 0 when the run would
    start; one line naming the fix (ConfigError, DataError, SubmissionError) when it would not.
    `opts` passed check_options where they were built (commands/run.py)."""
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    bench, cfg = resolved.benchmark, resolved.cfg
    ctx = _context(opts.device, opts.instances)
    if ctx.world_size % opts.instances:
        raise ConfigError(
            f"--instances {opts.instances} does not divide the {ctx.world_size} rank(s); "
            f"launch a multiple of {opts.instances} ranks"
        )
    ranks_per_model = ctx.world_size // opts.instances
    cfg.loop.local_batch_size(ranks_per_model)
    resolved.check_model(opts.config)
    scaling = "weak" if opts.instances > 1 else "strong"
    request = campaign_request(opts, resolved, scaling, stable_system_name(ctx))
    plan = plan_out(request)
    check_planned(opts, plan.settings.ruleset)  # the ruleset may be the campaign file's
    if opts.data is not None:
        bench.validate_dataset(cfg, opts.data)
    settings = plan.settings
    submission = SubmissionInfo(
        org=settings.submitter,
        division=settings.division,  # type: ignore[arg-type]
        status=settings.status,  # type: ignore[arg-type]
        platform=plan.system,
    )
    first_run = plan.to_run[0] if plan.to_run and scaling == "strong" else 0
    model_ctx = replace(
        ctx, world_size=ranks_per_model, num_nodes=max(1, ranks_per_model // ctx.local_world_size)
    )
    log = MLLog(None, enabled=ctx.is_main, echo=True)
    log.event(constants.CACHE_CLEAR, value=opts.clear_cache)
    log.start(constants.INIT_START)
    for key, value in init_events(bench, cfg, model_ctx, submission, plan.seeds[first_run]):
        log.event(key, value)
    log.end(constants.INIT_STOP)
    if ctx.is_main:
        loop = cfg.loop
        runs = f"{opts.instances} instances at once" if opts.instances > 1 else f"{len(plan.to_run)} run(s)"
        print(plan_line(plan, opts, plan.data))
        print(
            f"dry run: {bench.name} --config {opts.config}, {runs} on {ranks_per_model} rank(s) each "
            f"(batch {loop.local_batch_size(ranks_per_model)} per rank x {loop.gradient_accumulation_steps} "
            f"micro-batches), {loop.precision}{', compiled' if loop.compile else ''}, memory format "
            f"{resolve_memory_format(loop, bench, ctx.device)}, staging {opts.staging} run_start; "
            f"data {opts.data or _generated(opts, bench.name, cfg, plan.data)}. Nothing was built, staged or written."
        )
    return 0


def _generated(opts: RunOptions, benchmark: str, cfg: object, data_dir: Path) -> str:
    """How big the synthetic dataset of a run without --data is and where it goes (refused as the
    run would refuse it: generation.check_size)."""
    from mlhpc.generation import planned_data_text, run_size_check

    return planned_data_text(data_dir, run_size_check(benchmark, cfg, opts.config, opts.allow_size))


def _context(device: str, instances: int) -> DistContext:
    """This process's place in the job from the launcher's environment, without joining a group.
    A single process with --instances N starts N local ranks itself (commands/run.py), so its
    dry run plans for those."""
    launch = detect_launch()
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world, local = launch.world_size, launch.local_world_size
    if instances > 1 and world == 1:
        world = local = instances
    return DistContext(
        rank=launch.rank,
        local_rank=launch.local_rank,
        world_size=world,
        local_world_size=local,
        num_nodes=launch.num_nodes,
        device=torch.device("cuda" if cuda else "cpu"),
        backend="none",
        launcher=launch.launcher,
    )
