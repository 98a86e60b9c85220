"""`mlhpc run ... --dry-run`: check a run's config (and its data) and print what it would log up
to init_stop and what will train (the resolved config, the optimizer's parameter groups with the
weight decay on the gradient, the LR at the first step of every epoch; `--json FILE` writes the
same), building nothing heavy: a site checks a config on a login node before it queues a 512-node
job."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mlhpc.campaign.io import campaign_request, plan_out
from mlhpc.campaign.local import plan_line
from mlhpc.campaign.options import check_planned
from mlhpc.campaign.plan import CAMPAIGN_FILE, CampaignPlan
from mlhpc.campaign.prepare import Prepared
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.cluster.launch import detect_launch
from mlhpc.common.contract.config import to_dict
from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.writable import json_kind, refuse_output_over_inputs
from mlhpc.common.training.loop import SubmissionInfo, init_events, resolve_memory_format
from mlhpc.common.training.mllogger import MLLog, constants
from mlhpc.common.vocabulary import STAGING_WHEN
from mlhpc.generation import SizeCheck
from mlhpc.system_desc import stable_system_name


def dry_run(prepared: Prepared, json_out: Path | None = None) -> int:
    """Resolve and validate everything a run would before training, through the same planner (a
    taken --index, a changed config or a different first seed is refused here as in the run);
    print its MLLOG events up to init_stop (the first run's) and the plan. 0 when the run would
    start; one line naming the fix (ConfigError, DataError, SubmissionError) when it would not.
    Then what will train (`what_trains`), and with `json_out` the same as JSON there."""
    opts, resolved = prepared.opts, prepared.resolved
    bench, cfg = resolved.benchmark, resolved.cfg
    ctx = _context(opts.device, opts.instances)
    model_ctx = _model_context(ctx, opts.instances)
    cfg.loop.local_batch_size(model_ctx.world_size)
    resolved.check_batch(model_ctx.world_size)  # as the run refuses it, before anything is written
    resolved.check_model(opts.config)
    scaling = "weak" if opts.instances > 1 else "strong"
    request = campaign_request(opts, resolved, scaling, stable_system_name(ctx))
    plan = plan_out(request)
    check_planned(opts, plan.settings.ruleset)  # the ruleset may be the campaign file's
    json_where = None
    if json_out is not None:  # refused before anything is read or printed
        data = plan.data  # --data, or where the run would generate
        inputs = [data, opts.out / CAMPAIGN_FILE, opts.out / plan.settings.submitter]
        json_where = refuse_output_over_inputs(json_out, inputs, "--json", kind=DRY_RUN_KIND)
    if opts.data is not None:
        bench.validate_dataset(cfg, opts.data)
    settings = plan.settings
    submission = SubmissionInfo(
        submitter=settings.submitter,
        division=settings.division,  # type: ignore[arg-type]
        status=settings.status,  # type: ignore[arg-type]
        system=plan.system,
    )
    first_run = plan.to_run[0] if plan.to_run and scaling == "strong" else 0
    log = MLLog(None, enabled=ctx.is_main, echo=True)
    log.event(constants.CACHE_CLEAR, value=opts.clear_cache)
    log.start(constants.INIT_START)
    for key, value in init_events(bench, cfg, model_ctx, submission, plan.seeds[first_run]):
        log.event(key, value)
    log.end(constants.INIT_STOP)
    if ctx.is_main:
        _print_what_runs(prepared, plan, model_ctx, ctx.device, json_where)
    return 0


def _model_context(ctx: DistContext, instances: int) -> DistContext:
    """The ranks that train one model: all of them, or one instance's share."""
    if ctx.world_size % instances:
        raise ConfigError(
            f"--instances {instances} does not divide the {ctx.world_size} rank(s); "
            f"launch a multiple of {instances} ranks"
        )
    ranks = ctx.world_size // instances
    return replace(ctx, world_size=ranks, num_nodes=max(1, ranks // ctx.local_world_size))


def _print_what_runs(
    prepared: Prepared, plan: CampaignPlan, model_ctx: DistContext, device: torch.device, json_where: Path | None
) -> None:
    """What will train, then the plan, then the summary line (a site's script reads the last)."""
    opts, bench, cfg = prepared.opts, prepared.resolved.benchmark, prepared.resolved.cfg
    loop = cfg.loop
    data_text = opts.data or _generated(prepared.size, plan.data)
    if opts.data is not None:
        print(data_match_line(bench.name, cfg, opts.data))
    view = what_trains(bench, cfg, model_ctx) | {"config_name": opts.config}
    view["epoch_minutes_estimate"] = epoch_minutes(bench.name, cfg, model_ctx.world_size)
    print(training_text(view))
    if view["epoch_minutes_estimate"]:
        print(estimate_line(view["epoch_minutes_estimate"], cfg, model_ctx.world_size))
    if json_where is not None:
        write_json(view, json_where)
        print(f"wrote {shown(json_where)}")
    ranks = model_ctx.world_size
    runs = f"{opts.instances} instances at once" if opts.instances > 1 else f"{len(plan.to_run)} run(s)"
    written = " but the --json file" if json_where else ""
    print(plan_line(plan, prepared, plan.data))
    print(
        f"dry run: {bench.name} --config {opts.config}, {runs} on {ranks} rank(s) each "
        f"(batch {loop.local_batch_size(ranks)} per rank x {loop.gradient_accumulation_steps} "
        f"micro-batches), {loop.precision}{', compiled' if loop.compile else ''}, memory format "
        f"{resolve_memory_format(loop, bench, device)}, staging {STAGING_WHEN[opts.staging]}; "
        f"data {data_text}. Nothing was trained, staged or written{written}."
    )


def training_samples_in(benchmark: str, cfg: Any, data: Path) -> int | None:
    """How many training samples `data` holds, read as the benchmark's loader lists them; None
    for a benchmark whose layout this does not know."""
    if benchmark == "cosmoflow":
        from mlhpc.benchmarks.cosmoflow.data import read_file_lists

        return len(read_file_lists(Path(data) / "train"))
    if benchmark == "deepcam":
        from mlhpc.benchmarks.deepcam.data import sample_files

        return len(sample_files(Path(data) / "train", cfg.data.format))
    return None


def data_match_line(benchmark: str, cfg: Any, data: Path) -> str:
    """Whether --data holds the samples the config trains on, and the closed division's count
    (the `full` config's): said, not refused, as the run does not refuse it either."""
    from mlhpc.campaign.io import resolve_config

    found = training_samples_in(benchmark, cfg, data)
    wanted = getattr(getattr(cfg, "data", None), "num_train_samples", None)
    if found is None or not isinstance(wanted, int):
        return f"--data {shown(data)}: its sample count is not known for {benchmark}"
    closed = getattr(resolve_config(benchmark, "full", ()).cfg.data, "num_train_samples", None)
    verdict = "matches" if found == wanted else "DIFFERS from"
    division = f"; the closed division's dataset has {closed:,}" if isinstance(closed, int) else ""
    fix = f" (set data.num_train_samples={found}, or pass the dataset the config names)"
    fix = "" if found == wanted else fix
    return (
        f"--data {shown(data)} holds {found:,} training samples: {verdict} the config's "
        f"data.num_train_samples={wanted:,}{fix}{division}"
    )


PUBLISHED_SAMPLES_PER_S = {
    "cosmoflow": {"A100": 90.7, "H100": 200.0},
    "deepcam": {"A100": 21.3, "H100": 30.0},
}
"""Samples/s per accelerator in the published logs (docs/DATASETS.md, median of tracked_stats)."""


def epoch_minutes(benchmark: str, cfg: Any, ranks: int) -> dict[str, float] | None:
    """docs/DATASETS.md's formula for one epoch: training samples / (accelerators x published
    samples/s per accelerator) / 60, one figure per accelerator; None where no figure is known."""
    rates = PUBLISHED_SAMPLES_PER_S.get(benchmark)
    samples = getattr(getattr(cfg, "data", None), "num_train_samples", None)
    if rates is None or not isinstance(samples, int) or isinstance(samples, bool):
        return None
    return {gpu: samples / (ranks * rate) / 60 for gpu, rate in rates.items()}


def estimate_line(minutes: dict[str, float], cfg: Any, ranks: int) -> str:
    figures = ", ".join(f"{value:.3g} min on {gpu}" for gpu, value in minutes.items())
    return (
        f"time per epoch, estimated ({cfg.data.num_train_samples:,} samples on {ranks} accelerator(s) at "
        f"the published samples/s, docs/DATASETS.md): {figures}"
    )


def _generated(size: SizeCheck | None, data_dir: Path) -> str:
    """How big the synthetic dataset of a run without --data is and where it goes. A dataset that
    would not fit, or is over the size asked for, is said, not refused: the dry run touches no
    data, and a login node views a full config that its real run reads from --data."""
    from mlhpc.common.errors import DataError
    from mlhpc.generation import planned_data_text

    assert size is not None, "prepare() makes the size check of every run without --data"
    try:
        return planned_data_text(data_dir, size)
    except DataError as e:
        return f"none given; a run without --data here would refuse: {e}"


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


# ---------------------------------------------------------------- what will train

DECAY_FORMS = {
    "gradient": "g + wd w (L2 on the gradient)",
    "update": "wd w added to the normalised update (LAMB)",
    "decoupled": "w -= lr wd w (decoupled)",
    "unknown": "not known for this optimizer",
}
"""How an optimizer applies a group's weight_decay; only `gradient` puts it on the gradient."""


def train_steps_per_epoch(cfg: Any, ranks: int) -> int | None:
    """Optimizer steps in one epoch as the loop counts them: the config's training samples split
    over `ranks` (DistributedSampler drop_last), whole micro-batches (the loader's drop_last),
    then whole accumulation cycles; at least 1, as the schedules take it. None for a config
    without data.num_train_samples (a benchmark whose epoch is what its data holds)."""
    loop = cfg.loop
    samples = getattr(getattr(cfg, "data", None), "num_train_samples", None)
    if not isinstance(samples, int) or isinstance(samples, bool):
        return None
    per_rank = samples // ranks
    return max(1, per_rank // loop.local_batch_size(ranks) // loop.gradient_accumulation_steps)


def decay_form(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> str:
    """Where `group`'s weight_decay acts (a key of DECAY_FORMS)."""
    if group.get("decoupled_weight_decay") or group.get("decoupled_decay"):
        return "decoupled"
    if isinstance(optimizer, torch.optim.AdamW):
        return "decoupled"
    if type(optimizer).__name__.lower() in ("lamb", "fusedlamb"):
        return "update"
    coupled = (
        torch.optim.SGD,
        torch.optim.Adam,
        torch.optim.Adagrad,
        torch.optim.Adamax,
        torch.optim.RMSprop,
    )
    return "gradient" if isinstance(optimizer, coupled) else "unknown"


def describe_groups(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[dict[str, Any]]:
    """Each optimizer parameter group: its name, the names of its parameters (from the model, by
    identity), the weight decay given and the part of it that acts on the gradient."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        form = decay_form(optimizer, group)
        decay = float(group.get("weight_decay", 0.0))
        groups.append(
            {
                "name": str(group.get("name", f"group {i}")),
                "count": len(group["params"]),
                "names": [names.get(id(p), "?") for p in group["params"]],
                "weight_decay": decay,
                "weight_decay_form": form,
                "weight_decay_on_gradient": decay if form == "gradient" else 0.0,
            }
        )
    return groups


def lr_at_steps(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, steps: list[int]
) -> list[float]:
    """The first group's LR at each optimizer step in `steps` (ascending; 0 is the first step).
    A LambdaLR is a pure function of the step: its own lambda is read at each step, so a 128-epoch
    schedule of 8,192 steps an epoch costs nothing; any other scheduler is stepped through."""
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        base, schedule = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
        return [float(base * schedule(step)) for step in steps]
    found, done = [], 0
    with warnings.catch_warnings():  # stepped without optimizer.step(): torch warns about the order
        warnings.simplefilter("ignore")
        for step in steps:
            for _ in range(step - done):
                scheduler.step()
            done = step
            found.append(float(optimizer.param_groups[0]["lr"]))
    return found


def what_trains(bench: Any, cfg: Any, ctx: DistContext) -> dict[str, Any]:
    """The resolved config, the optimizer's parameter groups and the LR at the first step of every
    epoch up to max_epochs (index 0 is epoch_num 1), from the benchmark's own build_model and
    build_optimizer: the model is built on the meta device (no memory, no initialisation), so a
    full-size config costs what a mini does."""
    steps = train_steps_per_epoch(cfg, ctx.world_size)
    model = _model_without_memory(bench, cfg)
    optimizer, scheduler = bench.build_optimizer(cfg, model, ctx, steps or 1)
    epochs = int(cfg.loop.max_epochs)
    lrs = None if steps is None else lr_at_steps(optimizer, scheduler, [e * steps for e in range(epochs)])
    for epoch, lr in enumerate(lrs or [], start=1):
        if not math.isfinite(lr) or lr < 0:
            raise ConfigError(
                f"the learning rate at epoch_num {epoch} would be {lr} ({bench.name}'s schedule); "
                "check the optimizer section of the config"
            )
    return {
        "benchmark": bench.name,
        "config": to_dict(cfg),
        "steps_per_epoch": steps,
        "optimizer": type(optimizer).__name__,
        "param_groups": describe_groups(optimizer, model),
        "lr_per_epoch": lrs,
    }


def _model_without_memory(bench: Any, cfg: Any) -> torch.nn.Module:
    """The benchmark's model on the meta device; on the CPU where its construction needs real
    tensors (a third-party model reading values while it builds)."""
    try:
        with torch.device("meta"):
            return bench.build_model(cfg)
    except (NotImplementedError, RuntimeError):
        return bench.build_model(cfg)


def collapse_runs(values: list[float]) -> list[tuple[int, int, float]]:
    """(first epoch_num, last epoch_num, value) for each run of equal values, epoch_num from 1."""
    runs: list[tuple[int, int, float]] = []
    for epoch, value in enumerate(values, start=1):
        if runs and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], epoch, value)
        else:
            runs.append((epoch, epoch, value))
    return runs


def config_lines(config: dict[str, Any]) -> list[str]:
    """One line per section of the resolved config: `  section: key=value, ...` (values escaped:
    a config path's YAML is from outside)."""
    lines = []
    for section, values in config.items():
        if isinstance(values, dict):
            text = ", ".join(f"{key}={shown(str(value))}" for key, value in values.items())
        else:
            text = shown(str(values))
        lines.append(f"  {shown(str(section))}: {text}")
    return lines


def training_text(view: dict[str, Any], shown_names: int = 3) -> str:
    """The short table the dry run prints: each parameter group (count, weight decay on the
    gradient, the first names) and the LR by epoch, runs of equal values as one line."""
    steps = view["steps_per_epoch"]
    per_epoch = f", {steps} steps an epoch" if steps else ""
    lines = ["resolved config:", *config_lines(view["config"])]
    lines.append(f"optimizer {view['optimizer']}{per_epoch}; parameter groups:")
    for group in view["param_groups"]:
        names = ", ".join(shown(n) for n in group["names"][:shown_names])
        more = group["count"] - shown_names
        names += f", ... {more} more" if more > 0 else ""
        decay = f"WD on gradient {group['weight_decay_on_gradient']:g}"
        if group["weight_decay_form"] != "gradient" and group["weight_decay"]:
            decay += f" ({group['weight_decay']:g} as {DECAY_FORMS[group['weight_decay_form']]})"
        lines.append(f"  {shown(group['name'])}: {group['count']} parameters, {decay}: {names or '-'}")
    if view["lr_per_epoch"] is None:
        lines.append("learning rate per epoch: unknown (the config has no data.num_train_samples)")
        return "\n".join(lines)
    lines.append("learning rate at the first step of each epoch (epoch_num as MLLOG counts):")
    for first, last, value in collapse_runs(view["lr_per_epoch"]):
        epochs = f"{first}" if first == last else f"{first}-{last}"
        lines.append(f"  epoch {epochs:>9}  {value:.6g}")
    return "\n".join(lines)


def write_json(view: dict[str, Any], where: Path) -> None:
    """The view as JSON, written atomically to the path refuse_output_over_inputs returned (a
    third-party config's value JSON lacks, a path say, as its text)."""
    text = json.dumps({"format": DRY_RUN_FORMAT, **view}, indent=2, default=str, allow_nan=False)
    atomic_write_text(where, text + "\n")


DRY_RUN_FORMAT = "mlhpc run --dry-run"
"""The first key of `--json`: an existing file is replaced only when it carries it."""
DRY_RUN_KIND = json_kind(DRY_RUN_FORMAT)
