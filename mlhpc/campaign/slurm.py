"""`mlhpc run --slurm`: a strong-scaling campaign as Slurm jobs, one per seed through run_and_time.sh
(which runs `mlhpc run --index I`, writing result_I.txt straight into the submission), then one
job that checks the submission. The plan is `campaign.plan_campaign`'s; the script builders are
pure; `submit` calls sbatch."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlhpc.campaign.io import given_settings, plan_out, record_plan, resolve_config
from mlhpc.campaign.options import RunOptions, check_planned
from mlhpc.campaign.plan import SETTING_FLAGS, CampaignPlan, CampaignRequest, check_numbers
from mlhpc.common.errors import ConfigError, SubmissionError
from mlhpc.common.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.locks import folder_lock
from mlhpc.staging.manifest import MANIFEST_NAME

SBATCH_TIMEOUT_S = 60


@dataclass(frozen=True, kw_only=True)
class SlurmResources:
    """What every seed job asks Slurm for."""

    nodes: int = 1
    ntasks_per_node: int = 1
    """Ranks per node: one per GPU on GPU nodes, one (using every core) on CPU nodes."""
    time: str = "01:00:00"
    """Wall-clock limit of one seed job."""
    partition: str | None = None
    sbatch_args: tuple[str, ...] = ()
    """More sbatch options (--account=..., --gpus-per-node=4), written as #SBATCH lines of every job."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ntasks_per_node < 1:
            raise ConfigError(
                f"--slurm-nodes {self.nodes} --slurm-ntasks-per-node {self.ntasks_per_node}: "
                "both must be at least 1"
            )
        for arg in self.sbatch_args:
            if not arg.startswith("-") or any(c in arg for c in "\n\r"):
                raise ConfigError(
                    f"--sbatch-arg {arg!r} is not one sbatch option; write it as --sbatch-arg=--account=abc"
                )


@dataclass(frozen=True, kw_only=True)
class SlurmCampaign:
    """Everything the job scripts of one campaign need, with absolute paths."""

    benchmark: str
    config: str
    out: Path
    submitter: str
    system: str | None
    """None: the first seed job names it from its hardware (stable_system_name)."""
    ruleset: str
    seeds: tuple[int, ...]
    """The seed of result_<i>.txt, for every i of the campaign."""
    to_run: tuple[int, ...]
    """The result indices still to run (a resumed campaign keeps its finished ones)."""
    data: Path
    generate: bool
    """Whether a first job generates synthetic data into `data` (no --data given, none there yet)."""
    overrides: tuple[str, ...] = ()
    generate_flags: tuple[str, ...] = ()
    """Passed on to the data job's `mlhpc generate` (--allow-size: the login node checked the size)."""
    options: RunOptions
    """The campaign's options with absolute paths and the plan's first seed: each seed job runs
    them with its --index (`seed_argv`), so every `mlhpc run` flag reaches it."""
    run_and_time: Path
    mlhpc_cmd: tuple[str, ...]
    resources: SlurmResources = field(default_factory=SlurmResources)

    @property
    def slurm_dir(self) -> Path:
        return self.out / "slurm"

    def seed_argv(self, index: int) -> list[str]:
        """The `mlhpc` command line of seed job `index` (the check is the check job's)."""
        return replace(self.options, index=index, check=False).to_argv()


@dataclass(frozen=True)
class SubmittedJobs:
    """The job ids sbatch gave the campaign's jobs."""

    generate: str | None
    seeds: dict[int, str]
    check: str


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mlhpc run` options of a Slurm campaign."""
    group = parser.add_argument_group("Slurm campaign (one job per seed, then a job running mlhpc check)")
    group.add_argument("--slurm", action="store_true", help="submit the seeds as sbatch jobs and return")
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config (and --data) and print the MLLOG events up to init_stop, build "
        "nothing; with --slurm: print the scripts, submit nothing",
    )
    group.add_argument("--slurm-nodes", type=int, default=1, help="nodes per seed job (default 1)")
    group.add_argument(
        "--slurm-ntasks-per-node", type=int, default=1, help="ranks per node, one per GPU (default 1)"
    )
    group.add_argument("--slurm-time", default="01:00:00", help="time limit per seed job (default 01:00:00)")
    group.add_argument("--slurm-partition", default=None, help="partition (default: the cluster's)")
    group.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="more sbatch options for every job, repeatable: --sbatch-arg=--account=abc",
    )


def resources_from_args(args: argparse.Namespace) -> SlurmResources:
    """The --slurm-* options `add_slurm_arguments` reads."""
    return SlurmResources(
        nodes=args.slurm_nodes,
        ntasks_per_node=args.slurm_ntasks_per_node,
        time=args.slurm_time,
        partition=args.slurm_partition,
        sbatch_args=tuple(args.sbatch_arg),
    )


def absolute(opts: RunOptions) -> RunOptions:
    """`opts` with every path absolute (a job runs in another folder) and a config path too."""
    path = lambda p: None if p is None else Path(p).absolute()  # noqa: E731
    config = str(Path(opts.config).absolute()) if Path(opts.config).suffix else opts.config
    return replace(
        opts,
        config=config,
        out=Path(opts.out).absolute(),
        data=path(opts.data),
        local_dir=path(opts.local_dir),
        campaign=path(opts.campaign),
    )


def campaign_request(opts: RunOptions) -> CampaignRequest:
    """The campaign `mlhpc run ... --slurm` asks for, its config loaded and validated here on the
    login node; refuses what a job per seed cannot do. `opts` passed check_options."""
    if opts.instances > 1:
        raise ConfigError("--slurm submits the seeds of a strong-scaling campaign; drop --instances")
    if opts.index is not None:
        raise ConfigError("--slurm submits a job per index itself; drop --index")
    check_numbers(seeds=opts.seeds, first_seed=opts.first_seed, index=None)
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    opts = absolute(opts)
    return CampaignRequest(
        benchmark=resolved.info.name,
        config=opts.config,
        config_id=resolved.config_id,
        out=opts.out,
        seeds=opts.seeds,
        first_seed=opts.first_seed,
        resume=opts.resume,
        data=opts.data,
        settings=given_settings(opts.campaign, {name: getattr(opts, name) for name in SETTING_FLAGS}),
        default_system=None,  # the login node's hardware is not the compute nodes'
        default_division=resolved.default_division,
    )


def plan(request: CampaignRequest) -> CampaignPlan:
    """`campaign.plan_campaign` on what --out holds now (the planner draws a first seed if none)."""
    return plan_out(request)


def slurm_campaign(
    opts: RunOptions, p: CampaignPlan, request: CampaignRequest, resources: SlurmResources | None = None
) -> SlurmCampaign:
    """The job scripts' view of plan `p`: each seed job runs `opts` with the plan's first seed."""
    check_planned(opts, p.settings.ruleset)  # the campaign file's ruleset, refused here, not per job
    options = replace(absolute(opts), data=p.data, first_seed=p.first_seed)
    return SlurmCampaign(
        benchmark=p.benchmark,
        config=request.config,
        out=p.out,
        submitter=p.settings.submitter,
        system=p.settings.system,
        ruleset=p.settings.ruleset,
        seeds=p.seeds,
        to_run=p.to_run,
        data=p.data,
        generate=p.generated_data and not (p.data / MANIFEST_NAME).is_file(),
        overrides=opts.overrides,
        generate_flags=("--allow-size", str(opts.allow_size)) if opts.allow_size else (),
        options=options,
        run_and_time=find_run_and_time(),
        mlhpc_cmd=(sys.executable, "-m", "mlhpc"),
        resources=resources or SlurmResources(),
    )


def find_run_and_time() -> Path:
    """run_and_time.sh on PATH (the container images install it there), else the source checkout's."""
    on_path = shutil.which("run_and_time.sh")
    if on_path:
        return Path(on_path).absolute()
    beside = Path(__file__).resolve().parents[2] / "run_and_time.sh"
    if beside.is_file():
        return beside
    raise ConfigError("cannot find run_and_time.sh; put the repository's copy on PATH and submit again")


# sbatch options that ask for GPUs (or a share of them); --gres and --tres-per-task may name GPUs
# among other resources, so only their GPU entries go.
_GPU_OPTIONS = frozenset(
    {
        "-G",
        "--gpus",
        "--gpus-per-node",
        "--gpus-per-socket",
        "--gpus-per-task",
        "--cpus-per-gpu",
        "--mem-per-gpu",
        "--ntasks-per-gpu",
        "--gpu-bind",
        "--gpu-freq",
    }
)
_RESOURCE_LISTS = frozenset({"--gres", "--tres-per-task"})


def _option(arg: str) -> tuple[str, str, str]:
    """(name, separator, value) of one sbatch option as written: --a=b, --a b, -Gb or -G b."""
    if not arg.startswith("--"):
        return arg[:2], "", arg[2:]
    for sep in ("=", " ", "\t"):
        name, found, value = arg.partition(sep)
        if found:
            return name, found, value
    return arg, "", ""


def _is_gpu(resource: str) -> bool:
    kind = resource.strip().removeprefix("gres/").removeprefix("gres:")
    return kind == "gpu" or kind.startswith(("gpu:", "gpu/", "gpu="))


def without_gpus(sbatch_args: tuple[str, ...]) -> list[str]:
    """`sbatch_args` less every GPU request: the generate and check jobs run on a CPU, and a GPU
    asked for them would hold one idle (or wait for one) while the seeds need them."""
    kept = []
    for arg in sbatch_args:
        name, sep, value = _option(arg)
        if name in _GPU_OPTIONS:
            continue
        if name in _RESOURCE_LISTS:
            rest = [r for r in value.split(",") if r and not _is_gpu(r)]
            if rest:
                kept.append(f"{name}{sep}{','.join(rest)}")
            continue
        kept.append(arg)
    return kept


def directives(
    resources: SlurmResources, *, job_name: str, output: Path, single_task: bool = False
) -> list[str]:
    """The #SBATCH lines of one job; the generate and check jobs take a single task and no GPU."""
    lines = [f"#SBATCH --job-name={job_name}"]
    if single_task:
        lines += ["#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    else:
        lines += [
            f"#SBATCH --nodes={resources.nodes}",
            f"#SBATCH --ntasks-per-node={resources.ntasks_per_node}",
        ]
    lines.append(f"#SBATCH --time={resources.time}")
    if resources.partition:
        lines.append(f"#SBATCH --partition={resources.partition}")
    lines.append(f"#SBATCH --output={output}")
    extra = without_gpus(resources.sbatch_args) if single_task else resources.sbatch_args
    lines += [f"#SBATCH {arg}" for arg in extra]
    return lines


def _exports(values: dict[str, str]) -> list[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in values.items()]


def _script(header: str, sbatch_lines: list[str], body: list[str]) -> str:
    return "\n".join(["#!/bin/bash", f"# {header}", *sbatch_lines, "set -euo pipefail", *body]) + "\n"


def seed_script(c: SlurmCampaign, index: int) -> str:
    """The job that trains seed `index` on every task of its allocation into result_<index>.txt."""
    sbatch = directives(
        c.resources, job_name=f"mlhpc-{c.benchmark}-{index}", output=c.slurm_dir / f"seed_{index}-%j.out"
    )
    body = [
        "# Node-local disk to stage to; srun passes it to every rank.",
        'export MLHPC_LOCAL_DIR="${MLHPC_LOCAL_DIR:-${SLURM_TMPDIR:-/tmp}}"',
        "# The run's command line is the campaign's options (RunOptions.to_argv); BENCHMARK and SEED",
        "# are for run_and_time.sh's RESULT line, the seed as the planner gave it.",
        *_exports(
            {
                "BENCHMARK": c.benchmark,
                "SEED": str(c.seeds[index]),
                "LAUNCHER": "srun --kill-on-bad-exit=1",
                "MLHPC_CMD": shlex.join(c.mlhpc_cmd),
            }
        ),
        f"exec bash {shlex.join([str(c.run_and_time), *c.seed_argv(index)])}",
    ]
    return _script(f"mlhpc campaign {c.benchmark}: seed {c.seeds[index]}, result_{index}.txt", sbatch, body)


def generate_script(c: SlurmCampaign) -> str:
    """The job that writes the synthetic dataset every seed job stages from."""
    sbatch = directives(
        c.resources,
        job_name=f"mlhpc-{c.benchmark}-data",
        output=c.slurm_dir / "generate-%j.out",
        single_task=True,
    )
    command = [
        *c.mlhpc_cmd,
        "generate",
        c.benchmark,
        "--config",
        c.config,
        "--out",
        str(c.data),
        *c.generate_flags,
        *c.overrides,
    ]
    return _script(
        f"mlhpc campaign {c.benchmark}: synthetic data for every seed", sbatch, [shlex.join(command)]
    )


def check_script(c: SlurmCampaign) -> str:
    """The job that checks and scores the submission once every seed job has ended, however it ended."""
    sbatch = directives(
        c.resources,
        job_name=f"mlhpc-{c.benchmark}-check",
        output=c.slurm_dir / "check-%j.out",
        single_task=True,
    )
    command = [*c.mlhpc_cmd, "check", str(c.out / c.submitter), "--ruleset", c.ruleset]
    report = shlex.quote(str(c.slurm_dir / "check-")) + '"$SLURM_JOB_ID".json'
    return _script(
        f"mlhpc campaign {c.benchmark}: check the submission",
        sbatch,
        [f"{shlex.join(command)} --json {report}"],
    )


def scripts(c: SlurmCampaign) -> dict[str, str]:
    """File name -> text of every job script, in submission order."""
    texts = {"generate.sbatch": generate_script(c)} if c.generate else {}
    texts |= {f"seed_{i}.sbatch": seed_script(c, i) for i in c.to_run}
    texts["check.sbatch"] = check_script(c)
    return texts


def dry_run_text(c: SlurmCampaign) -> str:
    """The scripts and the sbatch commands `submit` would run, for --dry-run."""
    parts = []
    for name, text in scripts(c).items():
        parts.append(f"### {c.slurm_dir / name}\n{text}")
    seeds = ":".join(f"<seed_{i}>" for i in c.to_run)
    after_data = " --dependency=afterok:<generate> --kill-on-invalid-dep=yes" if c.generate else ""
    commands = ["sbatch --parsable " + str(c.slurm_dir / "generate.sbatch")] if c.generate else []
    commands += [f"sbatch --parsable{after_data} {c.slurm_dir / f'seed_{i}.sbatch'}" for i in c.to_run]
    dependency = f" --dependency=afterany:{seeds}" if seeds else ""
    commands.append(f"sbatch --parsable{dependency} {c.slurm_dir / 'check.sbatch'}")
    return "\n".join([*parts, "### would submit", *commands]) + "\n"


def submit(c: SlurmCampaign, sbatch: str = "sbatch") -> SubmittedJobs:
    """Write the scripts under <out>/slurm/ and submit them; the ids also go to slurm/jobs.json."""
    executable = shutil.which(sbatch)
    if executable is None:
        raise ConfigError(f"{sbatch} is not on PATH; submit from a Slurm login node, or pass --dry-run")
    paths = {name: atomic_write_text(c.slurm_dir / name, text) for name, text in scripts(c).items()}
    generate = _sbatch(executable, paths["generate.sbatch"]) if c.generate else None
    after_data = [f"--dependency=afterok:{generate}", "--kill-on-invalid-dep=yes"] if generate else []
    seeds = {i: _sbatch(executable, paths[f"seed_{i}.sbatch"], *after_data) for i in c.to_run}
    dependency = [f"--dependency=afterany:{':'.join(seeds.values())}"] if seeds else []
    check = _sbatch(executable, paths["check.sbatch"], *dependency)
    jobs = SubmittedJobs(generate=generate, seeds=seeds, check=check)
    atomic_write_json(
        c.slurm_dir / "jobs.json",
        {
            "generate": generate,
            "seeds": {str(i): {"job": job, "seed": c.seeds[i]} for i, job in seeds.items()},
            "check": check,
        },
    )
    return jobs


def _sbatch(executable: str, script: Path, *options: str) -> str:
    command = [executable, "--parsable", *options, str(script)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise SubmissionError(
            f"{shlex.join(command)} took over {SBATCH_TIMEOUT_S} s; is slurmctld up?"
        ) from e
    job = proc.stdout.strip().split(";", 1)[0]
    if proc.returncode != 0 or not job.isdigit():
        reason = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise SubmissionError(f"{shlex.join(command)} failed: {reason}")
    return job


def run_slurm_campaign(opts: RunOptions, resources: SlurmResources, *, dry_run: bool = False) -> int:
    """`mlhpc run --slurm`: print the plan (`dry_run`) or submit it and print the job ids. The
    config is validated first; the plan, the campaign file and the submission happen under
    --out's lock, so a second submission into --out waits for none and mixes nothing."""
    request = campaign_request(opts)
    if dry_run:
        print(dry_run_text(slurm_campaign(opts, plan(request), request, resources)), end="")
        return 0
    fix = "wait for it to end, or pass another --out"
    with folder_lock(request.out, f"mlhpc run {request.benchmark} --slurm", fix):
        planned = plan(request)
        campaign = slurm_campaign(opts, planned, request, resources)
        record_plan(planned)
        jobs = submit(campaign)
    for i, job in jobs.seeds.items():
        print(f"seed job {job}: seed {campaign.seeds[i]} -> result_{i}.txt")
    if jobs.generate:
        print(f"data job {jobs.generate}: generates {campaign.data} first")
    print(f"check job {jobs.check}: mlhpc check {campaign.out / campaign.submitter} after the seeds")
    print(f"scripts, outputs and jobs.json in {campaign.slurm_dir}")
    return 0
