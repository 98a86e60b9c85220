"""A Slurm campaign as a small job graph, built by one pure function (`build_graph`) from the
campaign's options and its plan: a job that generates the synthetic data (when none is given or
there yet), one job per seed through run_and_time.sh (`mlhpc run --index I --first-seed F`, and
the seed the planner gave for its RESULT line), and a job that checks the submission once every seed job has ended. The dry
run prints the graph (`SlurmGraph.dry_run_text`) and the submitter submits exactly it
(`SlurmGraph.sbatch_argv` with the job ids sbatch gave), so the two cannot drift. Torch-free."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from mlhpc.campaign.containers import LOCAL_DIR, Container
from mlhpc.campaign.job_strings import sbatch_time, sbatch_value, sbatch_words, script_word
from mlhpc.campaign.options import RunOptions
from mlhpc.campaign.plan import CampaignPlan
from mlhpc.common.errors import ConfigError


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
    container: Container | None = None
    """The image every job runs mlhpc in (--container), or None: the submitting Python's mlhpc."""

    @property
    def gpus(self) -> bool:
        """Whether the seed jobs ask for GPUs (a container runtime then passes them in)."""
        return list(self.sbatch_args) != without_gpus(self.sbatch_args)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ntasks_per_node < 1:
            raise ConfigError(
                f"--slurm-nodes {self.nodes} --slurm-ntasks-per-node {self.ntasks_per_node}: "
                "both must be at least 1"
            )
        # Judged here, where they are built: the dry run and the submission refuse the same.
        sbatch_time(self.time)
        if self.partition is not None:
            sbatch_value("--partition", self.partition, what="--slurm-partition")
        for arg in self.sbatch_args:
            sbatch_words(arg)


@dataclass(frozen=True)
class JobTools:
    """The programs the jobs call, by absolute path (a job runs in another folder)."""

    run_and_time: Path
    mlhpc_cmd: tuple[str, ...]
    """How a job calls mlhpc: the submitting Python's `python -m mlhpc`."""

    def run_and_time_env(self) -> dict[str, str]:
        """How run_and_time.sh calls mlhpc: MLHPC_PYTHON, one path never split (a Python whose
        path has a space), for `python -m mlhpc`; else MLHPC_CMD, which it splits on whitespace."""
        for word in (str(self.run_and_time), *self.mlhpc_cmd):
            script_word("the path of the submitting Python or run_and_time.sh", word)
        if len(self.mlhpc_cmd) == 3 and self.mlhpc_cmd[1:] == ("-m", "mlhpc"):
            return {"MLHPC_PYTHON": self.mlhpc_cmd[0]}
        if any(not word or any(c.isspace() for c in word) for word in self.mlhpc_cmd):
            raise ConfigError(
                f"the mlhpc command {shlex.join(self.mlhpc_cmd)} has a word with whitespace, which "
                "run_and_time.sh's MLHPC_CMD splits; call it as PYTHON -m mlhpc"
            )
        return {"MLHPC_CMD": " ".join(self.mlhpc_cmd)}


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """One node of the graph: a batch script, what it asks Slurm for and the jobs it waits for."""

    name: str
    """`generate`, `seed_<i>` or `check`: the script's file stem, and how other jobs name it."""
    header: str
    """The script's comment line: what the job does."""
    resources: tuple[str, ...]
    """Its sbatch options, written as the script's #SBATCH lines."""
    body: tuple[str, ...]
    """The script's commands."""
    after: tuple[str, ...] = ()
    """The names of the jobs it waits for."""
    dependency: Literal["afterok", "afterany"] = "afterok"
    """afterok: only once they all succeeded (and never, if one failed); afterany: once they ended."""
    index: int | None = None
    """A seed job's result index."""
    seed: int | None = None
    """A seed job's seed, as the planner gave it."""

    @property
    def script(self) -> str:
        # What sbatch reads: each option came through directives(), the header is one line.
        assert "\n" not in self.header and "\r" not in self.header, self.header
        sbatch = [f"#SBATCH {option}" for option in self.resources]
        return "\n".join(["#!/bin/bash", f"# {self.header}", *sbatch, "set -euo pipefail", *self.body]) + "\n"

    def dependency_options(self, ids: Mapping[str, str]) -> list[str]:
        """sbatch's --dependency for the job ids `ids` gives the jobs it waits for."""
        if not self.after:
            return []
        options = [f"--dependency={self.dependency}:{':'.join(ids[name] for name in self.after)}"]
        if self.dependency == "afterok":  # a job whose dependency can never be met is ended, not left pending
            options.append("--kill-on-invalid-dep=yes")
        return options


@dataclass(frozen=True)
class SlurmGraph:
    """A campaign's jobs, each after the jobs it waits for (the order they are submitted in)."""

    folder: Path
    """Where the scripts, their outputs and jobs.json go: <out>/slurm."""
    jobs: tuple[SlurmJob, ...]

    def script_path(self, job: SlurmJob) -> Path:
        return self.folder / f"{job.name}.sbatch"

    def sbatch_argv(self, job: SlurmJob, ids: Mapping[str, str]) -> list[str]:
        """The sbatch command that submits `job`, the jobs before it having the ids in `ids`."""
        return ["sbatch", "--parsable", *job.dependency_options(ids), str(self.script_path(job))]

    def dry_run_text(self) -> str:
        """Every script, then the sbatch commands the submitter runs, `<name>` for a job's id."""
        parts = [f"### {self.script_path(job)}\n{job.script}" for job in self.jobs]
        ids = {job.name: f"<{job.name}>" for job in self.jobs}
        commands = [" ".join(map(_shown, self.sbatch_argv(job, ids))) for job in self.jobs]
        return "\n".join([*parts, "### would submit", *commands]) + "\n"

    @property
    def seed_jobs(self) -> tuple[SlurmJob, ...]:
        return tuple(job for job in self.jobs if job.index is not None)


def _shown(word: str) -> str:
    """A word of a printed command, shell-quoted unless it is plain (a `<name>` placeholder too)."""
    return word if re.fullmatch(r"[\w<>:=/.,@%+-]+", word) else shlex.quote(word)


def build_graph(
    opts: RunOptions, plan: CampaignPlan, resources: SlurmResources, tools: JobTools, *, generate: bool
) -> SlurmGraph:
    """The jobs of the Slurm campaign `plan`: `opts` are the campaign's options with absolute
    paths (each seed job runs them with its --index and the plan's first seed, so every flag
    reaches it);
    `generate`: whether a first job generates the synthetic data the seed jobs stage."""
    folder = plan.out / "slurm"
    data_job = _generate_job(opts, plan, resources, tools, folder) if generate else None
    seeds = tuple(_seed_job(opts, plan, index, resources, tools, folder) for index in plan.to_run)
    if data_job is not None:
        seeds = tuple(replace(job, after=(data_job.name,)) for job in seeds)
    check = _check_job(plan, resources, tools, folder, after=tuple(job.name for job in seeds))
    return SlurmGraph(folder, (*((data_job,) if data_job else ()), *seeds, check))


def seed_argv(opts: RunOptions, plan: CampaignPlan, index: int) -> list[str]:
    """The `mlhpc` command line of the seed job of `index`: the campaign's options, its index and
    the plan's first seed (the check is the check job's)."""
    job = replace(opts, data=plan.data, index=index, first_seed=plan.first_seed, check=False)
    return job.to_argv()


def _seed_job(
    opts: RunOptions, plan: CampaignPlan, index: int, resources: SlurmResources, tools: JobTools, folder: Path
) -> SlurmJob:
    """The job that trains seed `index` on every task of its allocation into result_<index>.txt."""
    seed = plan.seeds[index]
    container = resources.container
    exports = {"BENCHMARK": plan.benchmark, "SEED": str(seed)}
    if container is None:
        exports |= {"LAUNCHER": "srun --kill-on-bad-exit=1", **tools.run_and_time_env()}
        launcher: tuple[str, ...] = ()
    else:  # the image's mlhpc; the node-local folder, as this job finds it, bound in
        exports["MLHPC_CMD"] = "mlhpc"
        words = container.words(gpus=resources.gpus)
        launcher = (
            "# mlhpc runs in the container; run_and_time.sh splits LAUNCHER on whitespace.",
            '[[ $MLHPC_LOCAL_DIR != *[[:space:]]* ]] || { echo "MLHPC_LOCAL_DIR has whitespace" >&2; exit 2; }',
            f'export LAUNCHER="srun --kill-on-bad-exit=1 {" ".join(words)}"',
        )
    body = (
        "# Node-local disk to stage to; srun passes it to every rank.",
        'export MLHPC_LOCAL_DIR="${MLHPC_LOCAL_DIR:-${SLURM_TMPDIR:-/tmp}}"',
        "# The run's command line is the campaign's options (RunOptions.to_argv) with this job's --index",
        "# and the plan's --first-seed; SEED, its seed as the planner gave it, is for the RESULT line.",
        *(f"export {key}={shlex.quote(value)}" for key, value in exports.items()),
        *launcher,
        f"exec bash {shlex.join([str(tools.run_and_time), *seed_argv(opts, plan, index)])}",
    )
    return SlurmJob(
        name=f"seed_{index}",
        header=f"mlhpc campaign {plan.benchmark}: seed {seed}, result_{index}.txt",
        resources=directives(
            resources, job_name=f"mlhpc-{plan.benchmark}-{index}", output=folder / f"seed_{index}-%j.out"
        ),
        body=body,
        index=index,
        seed=seed,
    )


def _generate_job(
    opts: RunOptions, plan: CampaignPlan, resources: SlurmResources, tools: JobTools, folder: Path
) -> SlurmJob:
    """The job that writes the synthetic dataset every seed job stages from; the login node
    checked its size, so --allow-size goes on."""
    allow = ("--allow-size", str(opts.allow_size)) if opts.allow_size else ()
    command = [*_mlhpc(resources, tools), "generate", plan.benchmark, "--config", opts.config, "--out", str(plan.data)]
    return SlurmJob(
        name="generate",
        header=f"mlhpc campaign {plan.benchmark}: synthetic data for every seed",
        resources=directives(
            resources,
            job_name=f"mlhpc-{plan.benchmark}-data",
            output=folder / "generate-%j.out",
            single_task=True,
        ),
        body=(shlex.join([*command, *allow, *opts.overrides]),),
    )


def _check_job(
    plan: CampaignPlan, resources: SlurmResources, tools: JobTools, folder: Path, after: tuple[str, ...]
) -> SlurmJob:
    """The job that checks and scores the submission once every seed job has ended, however it ended."""
    ruleset = plan.settings.ruleset
    # --short-campaign: a 2-seed try is a finished job, not a failed one (issue 40)
    command = [*_mlhpc(resources, tools), "check", str(plan.submitter_dir), "--ruleset", ruleset, "--short-campaign"]
    report = shlex.quote(str(folder / "check-")) + '"$SLURM_JOB_ID".json'
    return SlurmJob(
        name="check",
        header=f"mlhpc campaign {plan.benchmark}: check the submission",
        resources=directives(
            resources,
            job_name=f"mlhpc-{plan.benchmark}-check",
            output=folder / "check-%j.out",
            single_task=True,
        ),
        body=(f"{shlex.join(command)} --json {report}",),
        after=after,
        dependency="afterany",
    )


def _mlhpc(resources: SlurmResources, tools: JobTools) -> list[str]:
    """How a single-task job (generate, check) calls mlhpc: the submitting Python's, or the
    image's in one task of srun (pyxis starts a container only under srun), without GPUs."""
    if resources.container is None:
        return list(tools.mlhpc_cmd)
    static = replace(resources.container, binds=tuple(b for b in resources.container.binds if b != LOCAL_DIR))
    return ["srun", "--ntasks=1", *static.words(gpus=False), "mlhpc"]


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
) -> tuple[str, ...]:
    """The sbatch options of one job; the generate and check jobs take a single task and no GPU.
    Every value is judged where it lands (job_strings.sbatch_value): sbatch reads each back as
    written, and --output's `%` that is part of a folder's name is doubled (`%%` is a literal `%`)."""
    options = [f"--job-name={sbatch_value('--job-name', job_name, what='the job name')}"]
    if single_task:
        options += ["--nodes=1", "--ntasks=1"]
    else:
        options += [f"--nodes={resources.nodes}", f"--ntasks-per-node={resources.ntasks_per_node}"]
    options.append(f"--time={sbatch_time(resources.time)}")
    if resources.partition:
        options.append(
            f"--partition={sbatch_value('--partition', resources.partition, what='--slurm-partition')}"
        )
    folder = sbatch_value("--output", str(output.parent), what="--out", pattern=True, path=True)
    options.append(f"--output={folder}/{output.name}")  # the name's own %j is Slurm's pattern
    options += without_gpus(resources.sbatch_args) if single_task else resources.sbatch_args
    return tuple(options)
