"""`mlhpc run`: generate if needed, then per seed stage -> train to target -> result log; then check.

Every rank runs this; rank 0 alone writes the submission directory.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mlhpc import __version__
from mlhpc.common import registry
from mlhpc.common.config import load_config, to_dict
from mlhpc.common.distributed import DistContext
from mlhpc.common.errors import ConfigError, SubmissionError, TrainingError
from mlhpc.common.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.layout import implementation_dir, result_file, results_dir, system_json_path
from mlhpc.common.loop import RunResult, StagedData, SubmissionInfo, train_to_target
from mlhpc.common.mllogger import MLLog
from mlhpc.staging import CallbackComm, Communicator, build_manifest, resolve_local_dir, stage_dataset
from mlhpc.staging.comm import mpi_available
from mlhpc.staging.manifest import MANIFEST_NAME
from mlhpc.system_desc import default_system_name, describe_system

DATASET_COMPLETE = ".mlhpc_generated"


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
    division: Literal["closed", "open"] = "closed"
    status: Literal["onprem", "cloud", "preview", "research"] = "onprem"
    ruleset: str = "3.0.0"
    staging: Literal["inside", "before"] = "inside"
    clear_cache: bool = False
    check: bool = True


@dataclass
class CampaignResult:
    org_dir: Path
    system: str
    results: list[tuple[int, RunResult, Path | None]] = field(default_factory=list)
    check_status: int | None = None


def run_campaign(opts: RunOptions, ctx: DistContext) -> CampaignResult:
    if opts.staging == "before" and opts.ruleset in ("1.0.0", "2.0.0"):
        raise ConfigError(
            f"--staging before is not allowed by HPC ruleset {opts.ruleset}: it requires staging "
            "inside run_start..run_stop; use --staging inside or --ruleset 3.0.0"
        )
    bench = registry.get(opts.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(opts.config), opts.overrides)
    cfg.loop.local_batch_size(ctx.world_size)  # fail now, not after generating data
    system = opts.system or default_system_name(ctx)
    org_dir = Path(opts.out) / opts.submitter
    refuse_earlier_results(org_dir, system, bench.name)
    ctx.barrier()

    data_dir = opts.data if opts.data is not None else ensure_synthetic_data(bench, cfg, opts, ctx)
    if ctx.is_main:
        bench.validate_dataset(cfg, data_dir)
        write_submission_files(org_dir, system, bench.name, cfg, opts, ctx)
    ctx.barrier()

    seeds = campaign_seeds(opts, ctx)
    campaign = CampaignResult(org_dir=org_dir, system=system)
    submission = SubmissionInfo(
        org=opts.submitter, division=opts.division, status=opts.status, platform=system
    )
    local_root = resolve_local_dir(opts.local_dir)
    comm = staging_comm(ctx)
    for index, seed in enumerate(seeds):
        path = result_file(org_dir, system, "strong", bench.name, index)
        stage_dir = local_root / f"mlhpc-stage-{bench.name}-{ctx.broadcast_object(uuid.uuid4().hex)}"
        log = MLLog(path, enabled=ctx.is_main)
        try:
            result = train_to_target(
                bench,
                cfg,
                ctx,
                log,
                seed=seed,
                submission=submission,
                stage=lambda stage_dir=stage_dir: _stage(data_dir, stage_dir, ctx, comm),
                staging_inside_run=opts.staging == "inside",
                clear_cache=opts.clear_cache,
            )
        except BaseException:
            log.discard()
            raise
        finally:
            ctx.node_barrier()
            if ctx.local_rank == 0:
                shutil.rmtree(stage_dir, ignore_errors=True)
        written = log.close()
        campaign.results.append((seed, result, written))
        if result.status != "success":
            raise TrainingError(
                f"run {index} (seed {seed}) aborted: {result.error}; its log is {written or path}"
            )
    if opts.check and ctx.is_main:
        from mlhpc.submission_checker.command import check_command

        campaign.check_status = check_command(org_dir, ruleset=opts.ruleset)
    return campaign


def refuse_earlier_results(org_dir: Path, system: str, benchmark: str) -> None:
    """Never overwrite a submission: results already there are an error that names them."""
    existing = sorted(results_dir(org_dir, system, "strong", benchmark).glob("result_*.txt"))
    if existing:
        raise SubmissionError(
            f"{existing[0].parent} already holds {len(existing)} result file(s); "
            "pass a new --out or move the earlier results away"
        )


def ensure_synthetic_data(bench: registry.Benchmark, cfg: Any, opts: RunOptions, ctx: DistContext) -> Path:
    """Generate the benchmark's synthetic dataset once under <out>/datasets/, reusing a complete one."""
    data_dir = Path(opts.out) / "datasets" / f"{bench.name}-{Path(opts.config).stem}"
    if ctx.is_main and not (data_dir / DATASET_COMPLETE).is_file():
        shutil.rmtree(data_dir, ignore_errors=True)
        bench.generate(cfg, data_dir)
        build_manifest(data_dir).write(data_dir / MANIFEST_NAME)
        atomic_write_text(data_dir / DATASET_COMPLETE, f"generated by mlhpc {__version__}\n")
    ctx.barrier()
    return data_dir


def write_submission_files(
    org_dir: Path, system: str, benchmark: str, cfg: Any, opts: RunOptions, ctx: DistContext
) -> None:
    """systems/<system>.json and the implementation folder with the resolved config."""
    description = describe_system(
        ctx, submitter=opts.submitter, division=opts.division, status=opts.status, system=system
    )
    atomic_write_json(system_json_path(org_dir, system), description)
    impl = implementation_dir(org_dir, benchmark, "mlhpc-pytorch")
    atomic_write_text(impl / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    atomic_write_text(
        impl / "README.md",
        f"# {benchmark} with mlhpc {__version__}\n\n"
        f"Trained by `mlhpc run {benchmark} --config {opts.config}` with the overrides "
        f"{list(opts.overrides) or 'none'}; `config.yaml` is the resolved configuration.\n"
        "The code is the `mlhpc` package of the same version.\n",
    )


def campaign_seeds(opts: RunOptions, ctx: DistContext) -> list[int]:
    """Distinct positive seeds: first_seed, first_seed+1, ... or random ones chosen by rank 0."""
    if opts.seeds <= 0:
        raise ConfigError(f"--seeds {opts.seeds} must be at least 1")
    first = opts.first_seed
    if first is None:
        first = ctx.broadcast_object(int.from_bytes(os.urandom(3), "little") + 1)
    return [first + i for i in range(opts.seeds)]


def staging_comm(ctx: DistContext) -> Communicator:
    """Staging's collectives: MPI when mpirun started the job and mpi4py is there, else the
    torch.distributed group; under Horovod without mpi4py, only barriers (every node copies)."""
    if not ctx.distributed:
        return CallbackComm()
    if ctx.launcher == "mpi" and mpi_available():
        from mlhpc.staging.mpi_comm import MpiComm

        return MpiComm()
    if ctx.backend == "horovod":
        node = ctx.rank // max(1, ctx.local_world_size)
        return CallbackComm(
            ctx.local_rank, ctx.local_world_size, ctx.barrier, node=node, num_nodes=ctx.num_nodes
        )
    from mlhpc.staging.torch_comm import TorchComm

    return TorchComm()


def _stage(data_dir: Path, stage_dir: Path, ctx: DistContext, comm: Communicator) -> StagedData:
    """Every node gets the whole dataset (the loaders read all of it), the source read once."""
    report = stage_dataset(data_dir, stage_dir, comm=comm, mode="replicate", progress=ctx.is_main)
    return StagedData(path=stage_dir, metadata=report.metadata())
