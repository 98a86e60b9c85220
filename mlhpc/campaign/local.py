"""`mlhpc run`: generate if needed, then per seed stage -> train to target -> result log; then check.

Every rank runs this; rank 0 alone writes the submission directory.
"""

from __future__ import annotations

import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from mlhpc import __version__
from mlhpc.campaign.io import ResolvedConfig, campaign_request, plan_out, record_plan
from mlhpc.campaign.options import RunOptions, check_planned
from mlhpc.campaign.plan import CampaignPlan, CampaignRequest
from mlhpc.campaign.prepare import Prepared
from mlhpc.campaign.status import short_campaign_line
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import to_dict
from mlhpc.common.errors import MlhpcError, TrainingError
from mlhpc.common.layout import implementation_dir, system_json_path
from mlhpc.common.safeio.datasets import reading_through
from mlhpc.common.safeio.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.safeio.locks import FolderBusy, folder_lock
from mlhpc.common.training.loop import RunResult, StagedData, StartStaging, SubmissionInfo, train_to_target
from mlhpc.common.training.mllogger import MLLog
from mlhpc.common.training.progress import SILENT, CampaignClock, Progress, seed_line
from mlhpc.common.vocabulary import STAGING_WHEN
from mlhpc.generation import SizeCheck, generate_dataset
from mlhpc.power import EnergyCounter, PowerSampler, node_power, power_log_path
from mlhpc.staging import Communicator, StageReport, StageRequest, comm_for, stage_dataset
from mlhpc.staging.localdir import STAGE_PREFIX, claim_stage_dir, remove_claimed_dir, remove_stale_stage_dirs
from mlhpc.staging.overlap import OverlappedStaging
from mlhpc.system_desc import describe_system, merge_system_json, stable_system_name, write_system_json

T = TypeVar("T")


@dataclass
class CampaignResult:
    submitter_dir: Path
    system: str
    results: list[tuple[int, RunResult, Path | None]] = field(default_factory=list)
    """(seed, result, log) of each run this call trained (on rank 0: its instance's)."""
    kept: list[int] = field(default_factory=list)
    """Result indices a resumed campaign kept from before."""
    check_status: int | None = None


def plan_and_claim(request: CampaignRequest, claims: ExitStack, opts: RunOptions) -> CampaignPlan:
    """Plan the campaign, check `opts` under its ruleset, take the run lock of each index it runs
    (into `claims`) and clear those indices' half-written logs; nothing is recorded yet (see
    `record`). The caller holds --out's lock."""
    plan = plan_out(request)
    check_planned(opts, plan.settings.ruleset)  # the ruleset may be the campaign file's
    for index in plan.to_run:
        claims.enter_context(
            folder_lock(plan.run_lock_dir(index), f"mlhpc run --index {index}", "wait for that run to end")
        )
        # A killed run's half-written log; ours to delete while we hold the index's lock.
        for leftover in plan.results_dir.glob(f".result_{index}.txt.*.tmp"):
            if stat.S_ISREG(leftover.lstat().st_mode):  # a folder or a link of that name is not a log of ours
                leftover.unlink(missing_ok=True)
    return plan


def record(plan: CampaignPlan, cfg: Any, opts: RunOptions, ctx: DistContext) -> None:
    """Once the data, config and environment checks have passed: the campaign file, the system
    description and the implementation folder. A run refused before this point leaves no
    campaign.json, so the corrected command needs no --resume."""
    record_plan(plan)
    s = plan.settings
    fields = {"submitter": s.submitter, "division": s.division, "status": s.status, "system_name": s.system}
    merge_system_json(system_json_path(plan.submitter_dir, plan.system), fields)
    write_submission_files(plan, cfg, opts, ctx)


def run_campaign(prepared: Prepared, ctx: DistContext) -> CampaignResult:
    """Strong scaling: the seeds one after another on all ranks (or one index, --index). Weak
    scaling (instances > 1): the ranks split into groups that each train one model at once.
    The options were checked by `prepare`; the plan checks them again under its ruleset before
    anything is recorded."""
    opts, resolved = prepared.opts, prepared.resolved
    weak = opts.instances > 1
    group = ctx.split(opts.instances) if weak else ctx
    resolved.cfg.loop.local_batch_size(group.world_size)  # fail now, not after generating data
    resolved.check_batch(group.world_size)
    resolved.check_model(opts.config)  # before the campaign file records these sizes
    request = campaign_request(opts, resolved, "weak" if weak else "strong", stable_system_name(ctx))
    # Before --out is locked (which makes it): a refused plan or --data leaves --out as it was.
    on_main(ctx, lambda: check_before_lock(request, opts, resolved))
    what = f"mlhpc run {resolved.info.name}{' --resume' if opts.resume else ''}"
    with ExitStack() as claims:
        if opts.index is None:  # --out stays locked for the whole campaign
            claims.enter_context(holding_out(ctx, opts.out, what))
            plan = on_main(ctx, lambda: plan_and_claim(request, claims, opts))
            data_dir = _data_and_record(prepared, ctx, plan)
        else:  # one index: --out locked only to plan and prepare, so Slurm tasks run side by side
            with holding_out(ctx, opts.out, f"{what} --index {opts.index}", wait_s=INDEX_WAIT_S):
                plan = on_main(ctx, lambda: plan_and_claim(request, claims, opts))
                data_dir = _data_and_record(prepared, ctx, plan)
        return _train(prepared, ctx, group, plan, data_dir)


def check_before_lock(request: CampaignRequest, opts: RunOptions, resolved: ResolvedConfig) -> None:
    """What --out holds now planned (a refusal here is the one the locked plan would make) and a
    given --data checked against the config: refusals that must not leave a lock file, a folder
    or a campaign file behind. The plan is made again under the lock. An --index run plans only
    under the lock: the run it waits for may be mid-plan, and what it sees now is not its answer."""
    if opts.index is None:
        plan_out(request)
    if opts.data is not None:
        resolved.benchmark.validate_dataset(resolved.cfg, opts.data)


INDEX_WAIT_S = 600
"""How long `mlhpc run --index` waits for another run into --out to finish planning."""


def _data_and_record(prepared: Prepared, ctx: DistContext, plan: CampaignPlan) -> Path:
    """The dataset (generated if none was given), validated, and the submission's files."""
    bench, cfg = prepared.resolved.benchmark, prepared.resolved.cfg
    if ctx.local_rank == 0:  # each node's own local dir
        remove_stale_stage_dirs(prepared.local_root)
    data_dir = plan.data
    if prepared.size is not None:  # no --data: the plan's dataset folder (plan.generated_data)
        data_dir = ensure_synthetic_data(bench, cfg, plan.data, ctx, prepared.size)

    def validate_and_record() -> None:
        if plan.generated_data:  # a given --data was checked before the lock (check_before_lock)
            bench.validate_dataset(cfg, data_dir)
        record(plan, cfg, prepared.opts, ctx)

    on_main(ctx, validate_and_record)
    return data_dir


def _train(
    prepared: Prepared, ctx: DistContext, group: DistContext, plan: CampaignPlan, data_dir: Path
) -> CampaignResult:
    """Train the plan's runs (on rank 0 holding their run locks)."""
    opts, resolved = prepared.opts, prepared.resolved
    power = node_power(opts.power, ctx.local_rank)  # a node without a source: one line, before any work
    s = plan.settings
    campaign = CampaignResult(submitter_dir=plan.submitter_dir, system=plan.system, kept=list(plan.kept))
    submission = SubmissionInfo(
        submitter=s.submitter, division=s.division, status=s.status, system=plan.system
    )  # type: ignore[arg-type]
    # One staging communicator for the whole campaign: building one creates process groups.
    progress = Progress(enabled=ctx.is_main)
    progress.say(plan_line(plan, prepared, data_dir))
    if ctx.threads is not None and ctx.device.type == "cpu":
        progress.say(f"torch threads per rank: {ctx.threads.intra_op} ({ctx.threads.source})")
    runner = _SeedRunner(
        resolved.benchmark,
        resolved.cfg,
        opts,
        data_dir,
        plan,
        submission,
        ctx=group,
        comm=comm_for(group, beside_training=opts.staging == "overlap"),
        local_root=prepared.local_root,
        power=power,
        progress=progress,
    )
    campaign.results.extend(_run_each(runner, plan, ctx, progress))
    failed = [(seed, result, path) for seed, result, path in campaign.results if result.status != "success"]
    if failed:
        seed, result, path = failed[0]
        raise TrainingError(f"the run with seed {seed} aborted: {result.error}; its log is {path}")
    if opts.check and ctx.is_main:
        from mlhpc.submission_checker.command import CAMPAIGN_RULESET, check_command

        campaign.check_status = check_command(
            plan.submitter_dir,
            ruleset=s.ruleset,
            ruleset_reason=CAMPAIGN_RULESET,
            short_campaign=lambda found, required: short_campaign_line(found, required, plan.scaling, opts),
        )
    return campaign


def _run_each(
    runner: _SeedRunner, plan: CampaignPlan, ctx: DistContext, progress: Progress
) -> list[tuple[int, RunResult, Path | None]]:
    """Weak scaling: this rank's instance, at once with the others. Strong: the plan's runs one
    after another, each with the seed the planner gave its index."""
    if plan.scaling == "weak":
        instance = runner.ctx.instance or 0
        ran = [runner.run(instance, plan.seeds[instance])]
        ctx.barrier()  # the job ends when its last instance does
        return ran
    ran = []
    clock = CampaignClock(total=len(plan.to_run))  # "seed 3 of 10, about 4:48 left"
    for position, index in enumerate(plan.to_run, 1):
        progress.say(clock.line(position), "bold")
        started = time.monotonic()
        ran.append(runner.run(index, plan.seeds[index]))
        clock.finished(time.monotonic() - started)
    return ran


@dataclass(frozen=True)
class _SeedRunner:
    """Stages, trains one seed to target and writes its result log and time breakdown."""

    bench: registry.Benchmark
    cfg: Any
    opts: RunOptions
    data_dir: Path
    plan: CampaignPlan
    submission: SubmissionInfo
    ctx: DistContext
    """The ranks that train one model: the whole job, or one instance's group."""
    comm: Communicator
    local_root: Path
    power: list[EnergyCounter] | None = None
    """--power on this node's first rank: the counters sampled while each run is timed."""
    progress: Progress = SILENT
    """The lines for a person watching (rank 0): each seed's start, epochs and end."""

    def _power_sampler(self, entry_dir: Path, index: int) -> AbstractContextManager[object]:
        if self.power is None:
            return nullcontext()
        return PowerSampler(self.power, power_log_path(entry_dir, index))

    def run(self, index: int, seed: int) -> tuple[int, RunResult, Path | None]:
        ctx, comm = self.ctx, self.comm
        path = self.plan.result_path(index)
        # The owner's folder holds its marker and, in data/, the staged copy (which staging finds empty).
        owned = self.local_root / f"{STAGE_PREFIX}{self.bench.name}-{ctx.broadcast_object(uuid.uuid4().hex)}"
        stage_dir = owned / "data"
        metadata = {"instance": ctx.instance} if ctx.instance is not None else None
        log = MLLog(path, enabled=ctx.is_main, echo=self.opts.mllog_stdout, metadata=metadata)
        self.progress.say(f"seed {seed} -> {path.name}: staging {self.data_dir} to {stage_dir}", "bold")
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
                    staging=self.opts.staging,
                    start_staging=overlapped_staging(
                        _request(self.data_dir, stage_dir, ctx, self.opts, claims=owned / "claims"), comm
                    ),
                    clear_cache=self.opts.clear_cache,
                    progress=self.progress,
                )
        except BaseException:
            log.discard()
            raise
        finally:
            ctx.node_barrier()
            if ctx.local_rank == 0:
                # seconds on a busy machine: said, not a silent stretch before the seed's line
                with self.progress.say_if_slow(f"seed {seed}: removing its staged copy {owned}"):
                    remove_claimed_dir(owned)  # a second Ctrl-C leaves it marked, for the next run
        written = log.close()
        self._report(index, seed, result, written or path)
        return seed, result, written or path

    def _report(self, index: int, seed: int, result: RunResult, log: Path) -> None:
        """The run's line for the person watching and, on rank 0, its time breakdown."""
        self.progress.say(
            seed_line(
                seed=seed,
                status=result.status,
                epochs=result.epochs,
                run_seconds=result.run_seconds,
                detail=result.error,
            ),
            "green" if result.status == "success" else "red",
        )
        if self.ctx.is_main and result.breakdown is not None:
            threads = self.ctx.threads.as_record() if self.ctx.threads else None
            record = {
                "result": str(log),
                "seed": seed,
                **result.breakdown.to_dict(),
                "threads": threads,
                "allocator": self.ctx.allocator,
            }
            atomic_write_json(self.plan.breakdown_path(index), record)


def plan_line(plan: CampaignPlan, prepared: Prepared, data_dir: Path) -> str:
    """What the campaign will do, in one line for the person who started it."""
    opts = prepared.opts
    runs = [plan.seeds[i] for i in plan.to_run] if plan.scaling == "strong" else plan.seeds
    if opts.index is not None:
        kept = f" (run {opts.index} of the campaign, {len(plan.kept)} others finished)"
    else:
        kept = f", keeping {len(plan.kept)} finished" if plan.kept else ""
    return (
        f"{plan.benchmark} --config {opts.config}: {plan.scaling} scaling, seeds {runs}{kept}; "
        f"data {data_dir} staged to {prepared.local_root} ({STAGING_WHEN[opts.staging]}); "
        f"results in {plan.results_dir}"
    )


def ensure_synthetic_data(
    bench: registry.Benchmark, cfg: Any, data_dir: Path, ctx: DistContext, size: SizeCheck | None = None
) -> Path:
    """The benchmark's synthetic dataset in `data_dir` (campaign.dataset_dir), generated once and
    reused after (the folder rule is `generation.generate_dataset`'s; `size`: its size check).
    Rank 0 does it, holding --out's lock; its error reaches every rank."""
    fix = f"pass --data {data_dir} to train on them, or move it away so that mlhpc generates a dataset there"
    on_main(
        ctx,
        lambda: generate_dataset(
            data_dir,
            lambda folder: bench.generate(cfg, folder),
            reuse_complete=True,
            not_ours_fix=fix,
            size=size,
        ),
    )
    return data_dir


def write_submission_files(plan: CampaignPlan, cfg: Any, opts: RunOptions, ctx: DistContext) -> None:
    """systems/<system>.json (merged into the one there: see merge_system_json) and the
    implementation folder with the resolved config."""
    s = plan.settings
    description = describe_system(
        ctx, submitter=s.submitter, division=s.division, status=s.status, system=plan.system
    )
    write_system_json(system_json_path(plan.submitter_dir, plan.system), description)
    impl = implementation_dir(plan.submitter_dir, plan.benchmark, "mlhpc-pytorch")
    atomic_write_text(impl / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    atomic_write_text(
        impl / "README.md",
        f"# {plan.benchmark} with mlhpc {__version__}\n\n"
        f"Trained by `mlhpc run {plan.benchmark} --config {opts.config}` with the overrides "
        f"{list(opts.overrides) or 'none'}; `config.yaml` is the resolved configuration.\n"
        "The code is the `mlhpc` package of the same version.\n",
    )


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
def holding_out(ctx: DistContext, out: Path, what: str, wait_s: float = 0) -> Iterator[None]:
    """Rank 0 holds `out`'s lock (results, datasets, breakdowns: all a campaign writes) for the
    block; a second campaign into `out` is refused on every rank before it deletes, generates or
    trains anything (after waiting up to `wait_s` for the holder to let go)."""
    with ExitStack() as held:
        on_main(ctx, lambda: _take_lock(held, out, what, wait_s))
        yield


def _take_lock(held: ExitStack, out: Path, what: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            held.enter_context(folder_lock(out, what, "wait for it to end, or pass another --out"))
            return
        except FolderBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


def _request(
    data_dir: Path, stage_dir: Path, ctx: DistContext, opts: RunOptions, claims: Path | None = None
) -> StageRequest:
    """Every node gets the whole dataset (the loaders read all of it), the source read once."""
    return StageRequest(
        data_dir,
        stage_dir,
        mode="replicate",
        progress=ctx.is_main and claims is None,  # no bar over the epochs' lines
        io=opts.staging_io,
        durable=opts.durable,
        claims=claims,
    )


def _stage(
    data_dir: Path, stage_dir: Path, ctx: DistContext, comm: Communicator, opts: RunOptions
) -> StagedData:
    report = stage_dataset(_request(data_dir, stage_dir, ctx, opts), comm)
    return StagedData(path=stage_dir, metadata=report.metadata())


def overlapped_staging(request: StageRequest, comm: Communicator) -> StartStaging:
    """What the loop calls at run_start to stage `request` while training (--staging overlap)."""
    return lambda staged: _Overlapped(request, comm, staged)


class _Overlapped:
    """The loop's `BackgroundStaging` over `staging.overlap.OverlappedStaging`: `staged` runs in
    the staging thread once the copy is complete (it logs staging_stop)."""

    def __init__(
        self, request: StageRequest, comm: Communicator, staged: Callable[[StagedData], None]
    ) -> None:
        self.read_path = request.src
        self._staged = staged
        self._staging = OverlappedStaging(request, comm, done=self._done)

    def _done(self, report: StageReport) -> None:
        self._staged(StagedData(path=report.dest, metadata=report.metadata()))

    def reading(self) -> AbstractContextManager[None]:
        return reading_through(self._staging.node_copy())

    def read_order(self, paths: list[list[str]] | None) -> None:
        self._staging.read_order(paths)

    @property
    def failed(self) -> bool:
        return self._staging.failed

    @property
    def running(self) -> bool:
        return self._staging.running

    def finish(self) -> StagedData:
        report = self._staging.wait()
        return StagedData(path=report.dest, metadata=report.metadata())

    def stop(self) -> None:
        self._staging.stop()

    def seconds(self) -> float:
        return self._staging.seconds()

    def demand_copies(self) -> int:
        return self._staging.demand_copies()
