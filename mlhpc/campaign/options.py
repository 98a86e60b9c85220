"""`mlhpc run`'s options as one object, built once from the command line and taken by every route
(local, weak self-launch, `--dry-run`, `--slurm`), checked once (`check_options`) and written back
as a command line (`RunOptions.to_argv`) for the runs a route starts itself: the Slurm seed jobs
and the weak-scaling ranks. Torch-free: a login node builds, checks and writes it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mlhpc.campaign.seeds import check_numbers
from mlhpc.common.errors import ConfigError
from mlhpc.common.vocabulary import (
    DEFAULT_STAGING,
    STAGING_BEFORE_RUN_START_SINCE,
    Division,
    Ruleset,
    Staging,
    StagingIo,
    Status,
    staging_before_allowed,
)

if TYPE_CHECKING:
    from mlhpc.campaign.slurm_graph import SlurmResources

Backend = Literal["auto", "gloo", "nccl", "horovod"]
Device = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything `mlhpc run` was asked to do (every field is a flag: see `to_argv`)."""

    benchmark: str
    config: str = "mini"
    overrides: tuple[str, ...] = ()
    num_seeds: int = 1
    """--seeds: how many seeded runs a strong-scaling campaign has (the planner gives their values)."""
    first_seed: int | None = None
    """The seed of result_0.txt (None: the campaign file's, else one the planner draws)."""
    out: Path
    data: Path | None = None
    local_dir: Path | None = None
    allow_size: int | None = None
    """--allow-size: the largest synthetic dataset over 4 GiB this run may generate (bytes)."""
    submitter: str | None = None
    """None: the campaign file's, else mlhpc (the same for system, division, status, ruleset)."""
    system: str | None = None
    """None: the campaign file's, else this machine's stable_system_name."""
    division: Division | None = None
    """None: the campaign file's, else the benchmark's default for the config."""
    status: Status | None = None
    ruleset: Ruleset | None = None
    campaign: Path | None = None
    """--campaign FILE: submission-wide settings given as a campaign file."""
    staging: Staging = DEFAULT_STAGING
    staging_io: StagingIo = "auto"
    """The staging copy's I/O path (`mlhpc stage --io`)."""
    durable: bool = False
    """Have the staged copy on disk before staging ends (`mlhpc stage --durable`)."""
    clear_cache: bool = False
    check: bool = True
    resume: bool = False
    """Keep the campaign's finished runs in `out` and run only the missing or failed ones."""
    index: int | None = None
    """Run result index `index` of the campaign alone, straight into the submission."""
    instances: int = 1
    """Weak scaling: split the ranks into this many groups, each training its own model at once."""
    power: bool = False
    """Sample each node's power while a run is timed into <entry>/power/result_<i>/node_<host>.txt."""
    mllog_stdout: bool = False
    """Echo the MLLOG events on stdout too (they always go to the result files)."""
    backend: Backend = "auto"
    """The process group's backend (`init_distributed`)."""
    device: Device = "auto"

    def to_argv(self) -> list[str]:
        """The `mlhpc` command line that parses back to these options (`parse(to_argv(o)) == o`):
        what a Slurm seed job or a weak-scaling rank runs, so no flag is lost on the way."""
        words = ["run", self.benchmark, *self.overrides]  # overrides before the flags: argparse's `*`
        for f in fields(self):
            words += _ARGV[f.name](getattr(self, f.name))
        return words


def _valued(flag: str) -> Callable[[Any], list[str]]:
    """`--flag=value` (the `=` keeps a value that starts with `-` a value), nothing for None."""
    return lambda value: [] if value is None else [f"{flag}={value}"]


def _path_valued(flag: str) -> Callable[[Any], list[str]]:
    """`--flag=PATH`; a relative path that is exactly `--` goes as `./--` (the same path), since
    argparse reads `--flag=--` as no value at all."""
    return lambda value: [] if value is None else [f"{flag}={'./--' if str(value) == '--' else value}"]


def _switch(flag: str, when: bool = True) -> Callable[[Any], list[str]]:
    return lambda value: [flag] if bool(value) == when else []


def _positional(value: object) -> list[str]:
    return []  # written first by to_argv


# Every RunOptions field and how it is written: a field missing here is a KeyError in to_argv and a
# failing test (tests/campaign/test_run_options.py), so a new option cannot be dropped on the way to a job.
_ARGV: dict[str, Callable[[Any], list[str]]] = {
    "benchmark": _positional,
    "overrides": _positional,
    "config": _valued("--config"),
    "num_seeds": _valued("--seeds"),
    "first_seed": _valued("--first-seed"),
    "out": _path_valued("--out"),
    "data": _path_valued("--data"),
    "local_dir": _path_valued("--local-dir"),
    "allow_size": _valued("--allow-size"),
    "submitter": _valued("--submitter"),
    "system": _valued("--system"),
    "division": _valued("--division"),
    "status": _valued("--status"),
    "ruleset": _valued("--ruleset"),
    "campaign": _path_valued("--campaign"),
    "staging": _valued("--staging"),
    "staging_io": _valued("--io"),
    "durable": _switch("--durable"),
    "clear_cache": _switch("--clear-cache"),
    "check": _switch("--no-check", when=False),
    "resume": _switch("--resume"),
    "index": _valued("--index"),
    "instances": _valued("--instances"),
    "power": _switch("--power"),
    "mllog_stdout": _switch("--mllog-stdout"),
    "backend": _valued("--backend"),
    "device": _valued("--device"),
}


def from_args(args: argparse.Namespace) -> RunOptions:
    """The options `mlhpc run`'s parser read (commands/run.py): the one place they are built."""
    return RunOptions(
        benchmark=args.benchmark,
        config=args.config,
        overrides=tuple(args.overrides),
        num_seeds=args.num_seeds,
        first_seed=args.first_seed,
        out=args.out,
        data=args.data,
        local_dir=args.local_dir,
        allow_size=args.allow_size,
        submitter=args.submitter,
        system=args.system,
        division=args.division,
        status=args.status,
        ruleset=args.ruleset,
        campaign=args.campaign,
        index=args.index,
        staging=args.staging,
        staging_io=args.io,
        durable=args.durable,
        clear_cache=args.clear_cache,
        check=not args.no_check,
        resume=args.resume,
        instances=args.instances,
        power=args.power,
        mllog_stdout=args.mllog_stdout,
        backend=args.backend,
        device=args.device,
    )


def check_options(opts: RunOptions, slurm: SlurmResources | None = None) -> None:
    """The combinations of options the rules or the campaign model refuse, as one ConfigError.
    Every route calls it before it plans, and again with the ruleset the plan settled on
    (`check_planned`), before anything is recorded, submitted or staged; `slurm`: the resources
    of a Slurm campaign, whose strings reach job scripts (the dry run passes them too)."""
    check_numbers(num_runs=opts.num_seeds, first_seed=opts.first_seed, index=opts.index)
    check_numbers(num_runs=opts.instances, first_seed=opts.first_seed, index=None, flag="--instances")
    check_instances(opts.instances)
    if slurm is not None:
        from mlhpc.campaign.job_strings import check_slurm_strings

        check_slurm_strings(opts, slurm)
    if opts.staging == "before" and opts.ruleset is not None and not staging_before_allowed(opts.ruleset):
        raise ConfigError(
            f"--staging before is not allowed by HPC ruleset {opts.ruleset}: it requires staging "
            f"inside run_start..run_stop; use --staging inside or --ruleset {STAGING_BEFORE_RUN_START_SINCE}"
        )
    weak = opts.instances > 1
    if weak and opts.staging == "overlap":
        raise ConfigError(
            f"--instances {opts.instances} with --staging overlap: an instance's staging would need "
            "collectives of its own beside its training's; use --staging inside"
        )
    if weak and opts.num_seeds != 1:
        raise ConfigError(f"--instances {opts.instances} trains one model per instance; drop --seeds")
    if weak and opts.index is not None:
        raise ConfigError(f"--instances {opts.instances} trains every model at once; drop --index")
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


def check_instances(instances: int) -> None:
    """--instances K launched here (one process, no launcher) starts K local ranks: at most what
    this machine holds (machine.local_process_limit). Under a launcher the ranks are its own."""
    if instances <= 1:
        return
    from mlhpc.campaign.machine import local_process_limit
    from mlhpc.common.cluster.launch import detect_launch

    if detect_launch().world_size > 1:
        return
    limit = local_process_limit()
    if instances > limit.most:
        raise ConfigError(
            f"--instances {instances} would start {instances} local ranks, more than this machine holds "
            f"({limit.most}: {limit.why}); pass --instances {limit.most} or fewer, or start the ranks "
            "across nodes with a launcher (torchrun, srun)"
        )


def check_planned(opts: RunOptions, ruleset: str, slurm: SlurmResources | None = None) -> None:
    """`check_options` under the ruleset the plan settled on (a campaign file's may be the one)."""
    check_options(replace(opts, ruleset=ruleset), slurm)  # type: ignore[arg-type]
