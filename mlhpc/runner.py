"""`mlhpc run`: generate if needed, then per seed stage -> train to target -> result log; then check.

Every rank runs this; rank 0 alone writes the submission directory.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from mlhpc import __version__
from mlhpc.common import registry
from mlhpc.common.config import load_config, to_dict
from mlhpc.common.distributed import DistContext
from mlhpc.common.errors import ConfigError, MlhpcError, SubmissionError, TrainingError
from mlhpc.common.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.layout import (
    Scaling,
    breakdown_file,
    implementation_dir,
    result_file,
    results_dir,
    system_json_path,
)
from mlhpc.common.locks import folder_lock
from mlhpc.common.loop import RunResult, StagedData, SubmissionInfo, train_to_target
from mlhpc.common.mllogger import MLLog
from mlhpc.generation import generate_dataset
from mlhpc.power import EnergyCounter, PowerSampler, node_power, power_log_path
from mlhpc.resume import finished_runs, resumed_first_seed
from mlhpc.staging import Communicator, comm_for, resolve_local_dir, stage_dataset
from mlhpc.staging.localdir import STAGE_PREFIX, claim_stage_dir, remove_stale_stage_dirs
from mlhpc.system_desc import default_system_name, describe_system, merge_system_json, write_system_json

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything `mlhpc run` was asked to do."""

    benchmark: str
    config: str = "mini"
    overrides: tuple[str, ...] = ()
    seeds: int = 1
    first_seed: int | None = None
    out: Path
    data: Path | None = None
    local_dir: Path | None = None
    submitter: str = "mlhpc"
    system: str | None = None
    division: Literal["closed", "open"] | None = None
    """None: the benchmark's default for the config (closed unless its rules forbid it)."""
    status: Literal["onprem", "cloud", "preview", "research"] = "onprem"
    ruleset: str = "3.0.0"
    staging: Literal["inside", "before"] = "inside"
    staging_io: Literal["auto", "buffered", "direct", "kernel"] = "auto"
    """The staging copy's I/O path (`mlhpc stage --io`)."""
    durable: bool = False
    """Have the staged copy on disk before staging ends (`mlhpc stage --durable`)."""
    clear_cache: bool = False
    check: bool = True
    resume: bool = False
    """Keep the campaign's finished runs in `out` and run only the missing or failed ones."""
    instances: int = 1
    """Weak scaling: split the ranks into this many groups, each training its own model at once."""
    power: bool = False
    """Sample each node's power while a run is timed into <entry>/power/result_<i>/node_<host>.txt."""


@dataclass
class CampaignResult:
    org_dir: Path
    system: str
    results: list[tuple[int, RunResult, Path | None]] = field(default_factory=list)
    """(seed, result, log) of each run this call trained (on rank 0: its instance's)."""
    kept: list[int] = field(default_factory=list)
    """Result indices a resumed campaign kept from before."""
    check_status: int | None = None


def check_options(opts: RunOptions) -> None:
    """The combinations of options the rules or the campaign model refuse, as one ConfigError."""
    if opts.staging == "before" and opts.ruleset in ("1.0.0", "2.0.0"):
        raise ConfigError(
            f"--staging before is not allowed by HPC ruleset {opts.ruleset}: it requires staging "
            "inside run_start..run_stop; use --staging inside or --ruleset 3.0.0"
        )
    weak = opts.instances > 1
    if weak and opts.seeds != 1:
        raise ConfigError(f"--instances {opts.instances} trains one model per instance; drop --seeds")
    if weak and opts.power:
        raise ConfigError(
            "--power with --instances: instances sharing a node would each count its whole power; "
            "measure a strong-scaling campaign, or leave out --power"
        )
    if weak and opts.resume:
        raise ConfigError(
            "a weak-scaling job is timed as one (earliest run_start to latest run_stop), so it "
            "cannot be resumed; run it again into a new --out"
        )


def run_campaign(opts: RunOptions, ctx: DistContext) -> CampaignResult:
    """Strong scaling: the seeds one after another on all ranks. Weak scaling (instances > 1):
    the ranks split into groups that each train one model at the same time."""
    check_options(opts)
    weak = opts.instances > 1
    bench = registry.get(opts.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(opts.config), opts.overrides)
    if opts.division is None:
        division = bench.default_division(cfg) if bench.default_division is not None else "closed"
        opts = replace(opts, division=division)
    group = ctx.split(opts.instances) if weak else ctx
    cfg.loop.local_batch_size(group.world_size)  # fail now, not after generating data
    system = opts.system or default_system_name(ctx)
    scaling: Scaling = "weak" if weak else "strong"
    seeds = campaign_seeds(opts, ctx, count=opts.instances if weak else opts.seeds)
    with holding_out(ctx, Path(opts.out), f"mlhpc run {bench.name}{' --resume' if opts.resume else ''}"):
        return _run_locked(opts, ctx, bench, cfg, group, system, scaling, seeds)


def _run_locked(
    opts: RunOptions,
    ctx: DistContext,
    bench: registry.Benchmark,
    cfg: Any,
    group: DistContext,
    system: str,
    scaling: Scaling,
    seeds: list[int],
) -> CampaignResult:
    """The campaign, while rank 0 holds --out's lock."""
    weak = scaling == "weak"
    power = node_power(opts.power, ctx.local_rank)  # a node without a source: one line, before any work
    org_dir = Path(opts.out) / opts.submitter

    def plan_and_check() -> RunPlan:
        plan = plan_runs(org_dir, system, scaling, bench.name, seeds, cfg, opts)
        run_fields = {"submitter": opts.submitter, "division": opts.division, "status": opts.status}
        merge_system_json(system_json_path(org_dir, system), {**run_fields, "system_name": system})
        return plan

    plan = on_main(ctx, plan_and_check)  # a conflicting systems JSON is refused before any work
    local_root = resolve_local_dir(opts.local_dir)
    if ctx.local_rank == 0:  # each node's own local dir
        remove_stale_stage_dirs(local_root)
    data_dir = opts.data if opts.data is not None else ensure_synthetic_data(bench, cfg, opts, ctx)

    def validate_and_describe() -> None:
        bench.validate_dataset(cfg, data_dir)
        write_submission_files(org_dir, system, bench.name, cfg, opts, ctx)

    on_main(ctx, validate_and_describe)

    campaign = CampaignResult(org_dir=org_dir, system=system, kept=plan.kept)
    submission = SubmissionInfo(
        org=opts.submitter, division=opts.division, status=opts.status, platform=system
    )
    # One staging communicator for the whole campaign: building one creates process groups.
    runner = _SeedRunner(
        bench,
        cfg,
        opts,
        data_dir,
        org_dir,
        system,
        scaling,
        submission,
        ctx=group,
        comm=comm_for(group),
        local_root=local_root,
        power=power,
    )
    if weak:
        instance = group.instance or 0
        campaign.results.append(runner.run(instance, plan.seeds[instance]))
        ctx.barrier()  # the job ends when its last instance does
    else:
        for index in plan.to_run:
            campaign.results.append(runner.run(index, plan.seeds[index]))
    failed = [(seed, result, path) for seed, result, path in campaign.results if result.status != "success"]
    if failed:
        seed, result, path = failed[0]
        raise TrainingError(f"the run with seed {seed} aborted: {result.error}; its log is {path}")
    if opts.check and ctx.is_main:
        from mlhpc.submission_checker.command import check_command

        campaign.check_status = check_command(org_dir, ruleset=opts.ruleset)
    return campaign


@dataclass(frozen=True)
class _SeedRunner:
    """Stages, trains one seed to target and writes its result log and time breakdown."""

    bench: registry.Benchmark
    cfg: Any
    opts: RunOptions
    data_dir: Path
    org_dir: Path
    system: str
    scaling: Scaling
    submission: SubmissionInfo
    ctx: DistContext
    """The ranks that train one model: the whole job, or one instance's group."""
    comm: Communicator
    local_root: Path
    power: list[EnergyCounter] | None = None
    """--power on this node's first rank: the counters sampled while each run is timed."""

    def _power_sampler(self, entry_dir: Path, index: int) -> AbstractContextManager[object]:
        if self.power is None:
            return nullcontext()
        return PowerSampler(self.power, power_log_path(entry_dir, index))

    def run(self, index: int, seed: int) -> tuple[int, RunResult, Path | None]:
        ctx, comm = self.ctx, self.comm
        path = result_file(self.org_dir, self.system, self.scaling, self.bench.name, index)
        # The owner's folder holds its marker and, in data/, the staged copy (which staging finds empty).
        owned = self.local_root / f"{STAGE_PREFIX}{self.bench.name}-{ctx.broadcast_object(uuid.uuid4().hex)}"
        stage_dir = owned / "data"
        metadata = {"instance": ctx.instance} if ctx.instance is not None else None
        log = MLLog(path, enabled=ctx.is_main, metadata=metadata)
        try:
            # If the claim fails, staging meets the same error and tells every rank; this rank cannot.
            with suppress(OSError):
                if ctx.local_rank == 0:
                    claim_stage_dir(owned, self.opts.out)
            with self._power_sampler(path.parent, index):
                result = train_to_target(
                    self.bench,
                    self.cfg,
                    ctx,
                    log,
                    seed=seed,
                    submission=self.submission,
                    stage=lambda: _stage(self.data_dir, stage_dir, ctx, comm, self.opts),
                    staging_inside_run=self.opts.staging == "inside",
                    clear_cache=self.opts.clear_cache,
                )
        except BaseException:
            log.discard()
            raise
        finally:
            ctx.node_barrier()
            if ctx.local_rank == 0:
                shutil.rmtree(owned, ignore_errors=True)
        written = log.close()
        if ctx.is_main and result.breakdown is not None:
            where = breakdown_file(self.org_dir, self.system, self.scaling, self.bench.name, index)
            atomic_write_json(
                where, {"result": str(written or path), "seed": seed, **result.breakdown.to_dict()}
            )
        return seed, result, written or path


@dataclass(frozen=True)
class RunPlan:
    """Which result indices a campaign still has to run, and every index's seed."""

    seeds: list[int]
    to_run: list[int]
    kept: list[int]


def plan_runs(
    org_dir: Path, system: str, scaling: Scaling, benchmark: str, seeds: list[int], cfg: Any, opts: RunOptions
) -> RunPlan:
    """Never overwrite a finished run. Without --resume, results already there are an error; with
    it, successful runs are kept (their seeds fix the campaign's) and the others rerun."""
    folder = results_dir(org_dir, system, scaling, benchmark)
    existing = sorted(folder.glob("result_*.txt"))
    if not existing:
        return RunPlan(seeds=seeds, to_run=list(range(len(seeds))), kept=[])
    if not opts.resume:
        raise SubmissionError(
            f"{folder} already holds {len(existing)} result file(s); pass --resume to finish "
            "that campaign, a new --out, or move the earlier results away"
        )
    _check_same_config(org_dir, benchmark, cfg)
    # A killed run's half-written logs; only ours to delete because the caller holds --out's lock.
    for leftover in folder.glob(".result_*.tmp"):
        leftover.unlink(missing_ok=True)
    finished = finished_runs(folder.glob("result_*.txt"))
    first = resumed_first_seed(finished, len(seeds), opts.first_seed, folder)
    if first is not None:
        seeds = [first + i for i in range(len(seeds))]
    kept = sorted(finished)
    return RunPlan(seeds=seeds, to_run=[i for i in range(len(seeds)) if i not in finished], kept=kept)


def _check_same_config(org_dir: Path, benchmark: str, cfg: Any) -> None:
    saved = implementation_dir(org_dir, benchmark, "mlhpc-pytorch") / "config.yaml"
    if saved.is_file() and yaml.safe_load(saved.read_text()) != yaml.safe_load(yaml.safe_dump(to_dict(cfg))):
        raise ConfigError(
            f"the campaign being resumed ran with the config in {saved}; pass the same --config and "
            "overrides, or a new --out"
        )


def ensure_synthetic_data(bench: registry.Benchmark, cfg: Any, opts: RunOptions, ctx: DistContext) -> Path:
    """The benchmark's synthetic dataset in <out>/datasets/<benchmark>-<config>/, generated once
    and reused after (the folder rule is `generation.generate_dataset`'s). Rank 0 does it, holding
    --out's lock; its error reaches every rank."""
    data_dir = Path(opts.out) / "datasets" / f"{bench.name}-{Path(opts.config).stem}"
    fix = f"pass --data {data_dir} to train on them, or move it away so that mlhpc generates a dataset there"
    on_main(
        ctx,
        lambda: generate_dataset(
            data_dir, lambda folder: bench.generate(cfg, folder), reuse_complete=True, not_ours_fix=fix
        ),
    )
    return data_dir


def write_submission_files(
    org_dir: Path, system: str, benchmark: str, cfg: Any, opts: RunOptions, ctx: DistContext
) -> None:
    """systems/<system>.json (merged into the one there: see merge_system_json) and the
    implementation folder with the resolved config."""
    description = describe_system(
        ctx, submitter=opts.submitter, division=opts.division, status=opts.status, system=system
    )
    write_system_json(system_json_path(org_dir, system), description)
    impl = implementation_dir(org_dir, benchmark, "mlhpc-pytorch")
    atomic_write_text(impl / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    atomic_write_text(
        impl / "README.md",
        f"# {benchmark} with mlhpc {__version__}\n\n"
        f"Trained by `mlhpc run {benchmark} --config {opts.config}` with the overrides "
        f"{list(opts.overrides) or 'none'}; `config.yaml` is the resolved configuration.\n"
        "The code is the `mlhpc` package of the same version.\n",
    )


def campaign_seeds(opts: RunOptions, ctx: DistContext, count: int | None = None) -> list[int]:
    """`count` (default --seeds) distinct positive seeds: first_seed, first_seed+1, ... from
    --first-seed or from a random first seed chosen by rank 0."""
    count = opts.seeds if count is None else count
    if count <= 0:
        raise ConfigError(f"--seeds {count} must be at least 1")
    first = opts.first_seed
    if first is None:
        first = ctx.broadcast_object(int.from_bytes(os.urandom(3), "little") + 1)
    return [first + i for i in range(count)]


def on_main(ctx: DistContext, work: Callable[[], T]) -> T:
    """Do `work` on rank 0 only and hand its result, or its error, to every rank, so that a bad
    dataset or a refused --out stops the whole job at once instead of leaving ranks waiting."""
    outcome: tuple[bool, Any] | None = None
    if ctx.is_main:
        try:
            outcome = (True, work())
        except MlhpcError as error:
            outcome = (False, error)
    succeeded, value = ctx.broadcast_object(outcome)
    if not succeeded:
        raise value
    return value


@contextmanager
def holding_out(ctx: DistContext, out: Path, what: str) -> Iterator[None]:
    """Rank 0 holds `out`'s lock (results, datasets, breakdowns: all a campaign writes) for the
    block; a second campaign into `out` is refused on every rank before it deletes, generates or
    trains anything."""
    with ExitStack() as held:
        on_main(
            ctx,
            lambda: held.enter_context(folder_lock(out, what, "wait for it to end, or pass another --out")),
        )
        yield


def _stage(
    data_dir: Path, stage_dir: Path, ctx: DistContext, comm: Communicator, opts: RunOptions
) -> StagedData:
    """Every node gets the whole dataset (the loaders read all of it), the source read once."""
    report = stage_dataset(
        data_dir,
        stage_dir,
        comm=comm,
        mode="replicate",
        progress=ctx.is_main,
        io=opts.staging_io,
        durable=opts.durable,
    )
    return StagedData(path=stage_dir, metadata=report.metadata())
