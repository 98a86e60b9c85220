"""`mlhpc run --slurm`: a strong-scaling campaign as Slurm jobs. The login node checks the options
and the config, plans the campaign (campaign/plan.py), builds its job graph (campaign/slurm_graph.py)
and either prints it (--dry-run) or records the plan and submits exactly that graph with
`sbatch --parsable`, each job's dependencies given the ids sbatch returned."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from mlhpc.campaign.containers import LOCAL_DIR, container_for, outermost
from mlhpc.campaign.io import campaign_request, plan_out, record_plan
from mlhpc.campaign.options import RunOptions, check_options, check_planned
from mlhpc.campaign.plan import CampaignPlan, CampaignRequest
from mlhpc.campaign.prepare import Prepared
from mlhpc.campaign.slurm_graph import JobTools, SlurmGraph, SlurmResources, build_graph
from mlhpc.common.errors import ConfigError, SubmissionError
from mlhpc.common.safeio.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.safeio.locks import folder_lock
from mlhpc.staging.manifest import MANIFEST_NAME

SBATCH_TIMEOUT_S = 60


def resources_from_args(args: argparse.Namespace) -> SlurmResources:
    """The --slurm-* and --sbatch-arg options (commands/run.py adds them)."""
    return SlurmResources(
        nodes=args.slurm_nodes,
        ntasks_per_node=args.slurm_ntasks_per_node,
        time=args.slurm_time,
        partition=args.slurm_partition,
        sbatch_args=tuple(args.sbatch_arg),
        container=container_for(args.container, args.container_runtime, binds=()),
    )


def bound_folders(opts: RunOptions, plan: CampaignPlan) -> tuple[str, ...]:
    """The host folders a containerized job reads or writes, each bound at its own path: --out
    (the submission, the generated data, the logs), --data, --campaign's folder and the node-local
    folder (--local-dir, else as the job finds it)."""
    folders = [plan.out, plan.data, *([opts.campaign.parent] if opts.campaign else [])]
    kept = outermost([Path(f).resolve() for f in folders])
    return (*kept, str(Path(opts.local_dir).resolve()) if opts.local_dir else LOCAL_DIR)


def absolute(opts: RunOptions) -> RunOptions:
    """`opts` with every path absolute and resolved (a job runs in another folder, where a `..`
    after a link would lead elsewhere) and a config path too."""
    path = lambda p: None if p is None else Path(p).resolve()  # noqa: E731
    config = str(Path(opts.config).resolve()) if Path(opts.config).suffix else opts.config
    return replace(
        opts,
        config=config,
        out=opts.out.resolve(),
        data=path(opts.data),
        local_dir=path(opts.local_dir),
        campaign=path(opts.campaign),
    )


def slurm_request(prepared: Prepared) -> CampaignRequest:
    """The campaign `mlhpc run ... --slurm` asks for, its config loaded and validated here on the
    login node (`prepare`); refuses what a job per seed cannot do."""
    opts = prepared.opts
    if opts.instances > 1:
        raise ConfigError("--slurm submits the seeds of a strong-scaling campaign; drop --instances")
    if opts.index is not None:
        raise ConfigError("--slurm submits a job per index itself; drop --index")
    # The login node's hardware is not the compute nodes': the first seed job names the system.
    return campaign_request(absolute(opts), prepared.resolved, "strong", default_system=None)


def find_run_and_time() -> Path:
    """run_and_time.sh on PATH (the container images install it there), else the source checkout's."""
    on_path = shutil.which("run_and_time.sh")
    if on_path:
        return Path(on_path).absolute()
    beside = Path(__file__).resolve().parents[2] / "run_and_time.sh"
    if beside.is_file():
        return beside
    raise ConfigError("cannot find run_and_time.sh; put the repository's copy on PATH and submit again")


def slurm_graph(opts: RunOptions, plan: CampaignPlan, resources: SlurmResources) -> SlurmGraph:
    """The job graph of `plan`, under the ruleset the plan settled on (refused here, not per job)."""
    check_planned(opts, plan.settings.ruleset, resources)
    if resources.container is not None:
        resources = replace(resources, container=replace(resources.container, binds=bound_folders(opts, plan)))
    tools = JobTools(run_and_time=find_run_and_time(), mlhpc_cmd=(sys.executable, "-m", "mlhpc"))
    generate = plan.generated_data and not (plan.data / MANIFEST_NAME).is_file()
    return build_graph(absolute(opts), plan, resources, tools, generate=generate)


def submit(graph: SlurmGraph, sbatch: str = "sbatch") -> dict[str, str]:
    """Write the graph's scripts under <out>/slurm/ and submit each job with the command
    `graph.sbatch_argv` gives (the dry run prints the same); {job name: id}, also in jobs.json."""
    executable = shutil.which(sbatch)
    if executable is None:
        raise ConfigError(f"{sbatch} is not on PATH; submit from a Slurm login node, or pass --dry-run")
    for job in graph.jobs:
        atomic_write_text(graph.script_path(job), job.script)
    ids: dict[str, str] = {}
    for job in graph.jobs:
        try:
            ids[job.name] = sbatch_job_id([executable, *graph.sbatch_argv(job, ids)[1:]])
        except SubmissionError as e:
            raise SubmissionError(f"{e}{_cancel(ids)}") from e
    seeds = {str(job.index): {"job": ids[job.name], "seed": job.seed} for job in graph.seed_jobs}
    record = {"generate": ids.get("generate"), "seeds": seeds, "check": ids["check"]}
    atomic_write_json(graph.folder / "jobs.json", record)
    return ids


def _cancel(ids: dict[str, str]) -> str:
    """Cancel the jobs this submission queued before one was refused (their ids are sbatch's
    answers to it: nothing else is touched), so no half graph runs; what was done, for the line."""
    if not ids:
        return "; nothing was submitted"
    listed = " ".join(ids.values())
    scancel = shutil.which("scancel")
    if scancel is None:
        return f"; jobs {listed} were submitted before it: scancel {listed}"
    try:
        proc = subprocess.run(
            [scancel, *ids.values()], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"; jobs {listed} were submitted before it and scancel did not answer: scancel {listed}"
    if proc.returncode != 0:
        return f"; jobs {listed} were submitted before it and scancel failed: scancel {listed}"
    return f"; cancelled the jobs submitted before it ({listed})"


def sbatch_job_id(command: list[str]) -> str:
    """Run one `sbatch --parsable` command: the job id it prints."""
    import shlex

    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise SubmissionError(
            f"{shlex.join(command)} took over {SBATCH_TIMEOUT_S} s; is slurmctld up?"
        ) from e
    job = proc.stdout.strip().split(";", 1)[0]
    if proc.returncode != 0 or not (job.isascii() and job.isdigit()):
        reason = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise SubmissionError(f"{shlex.join(command)} failed: {reason}")
    return job


def run_slurm_campaign(prepared: Prepared, resources: SlurmResources, *, dry_run: bool = False) -> int:
    """`mlhpc run --slurm`: print the job graph (`dry_run`) or submit it and print the job ids.
    The config is validated first; the plan, the campaign file and the submission happen under
    --out's lock, so a second submission into --out waits for none and mixes nothing."""
    opts = prepared.opts
    check_options(opts, resources)  # the strings that reach job scripts, dry run or not
    request = slurm_request(prepared)
    if dry_run:
        print(slurm_graph(opts, plan_out(request), resources).dry_run_text(), end="")
        return 0
    fix = "wait for it to end, or pass another --out"
    with folder_lock(request.out, f"mlhpc run {request.benchmark} --slurm", fix):
        planned = plan_out(request)
        graph = slurm_graph(opts, planned, resources)
        record_plan(planned)
        ids = submit(graph)
    for job in graph.seed_jobs:
        print(f"seed job {ids[job.name]}: seed {job.seed} -> result_{job.index}.txt")
    if "generate" in ids:
        print(f"data job {ids['generate']}: generates {planned.data} first")
    print(f"check job {ids['check']}: mlhpc check {planned.submitter_dir} after the seeds")
    print(f"scripts, outputs and jobs.json in {graph.folder}")
    return 0
