"""`mlhpc run`: its options and the handler that runs a campaign here, under torchrun, or on Slurm."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from mlhpc.commands import ALLOW_SIZE_HELP, add_command, size_argument
from mlhpc.common.vocabulary import (
    DEFAULT_RULESET,
    DEFAULT_STAGING,
    DIVISIONS,
    IO_CHOICES,
    RULESETS,
    STAGINGS,
    STATUSES,
)

if TYPE_CHECKING:
    from mlhpc.campaign.options import RunOptions
    from mlhpc.campaign.prepare import Prepared


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    """Add run: its options in groups, one function each (docs/RUNNING.md's options table lists them)."""
    run = add_command(
        sub,
        "run",
        "stage, train each seed to target, write and check a submission",
        "mlhpc run cosmoflow --config mini --seeds 10 --out runs/\n"
        "mlhpc run cosmoflow --config mini --seeds 10 --out runs/ --resume   # after an interruption\n"
        "mlhpc run cosmoflow --config mini --instances 10 --out runs/weak   # weak scaling\n"
        "mlhpc run cosmoflow --out runs/ --index 3   # one run, as result_3.txt of the campaign\n"
        "torchrun --nproc_per_node=2 -m mlhpc run cosmoflow --seeds 1 --out runs/",
    )
    run.add_argument("benchmark")
    _campaign_options(run.add_argument_group("the campaign"))
    _data_options(run.add_argument_group("data and staging"))
    _submission_options(run.add_argument_group("submission-wide settings (recorded in <out>/campaign.json)"))
    _runtime_options(run.add_argument_group("the run"))
    _dry_run_options(run.add_argument_group("look before you run"))
    _slurm_options(
        run.add_argument_group("Slurm campaign (one job per seed, then a job running mlhpc check)")
    )
    run.add_argument(
        "overrides",
        nargs="*",
        default=[],  # without a default argparse lists key=value among the required arguments
        metavar="key=value",
        help="config overrides (optional), e.g. loop.max_epochs=20",
    )
    run.set_defaults(handler=_run)


def _campaign_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--config", default="mini", help="mini, full, or a YAML path (default mini)")
    group.add_argument(
        "--seeds",
        dest="num_seeds",
        type=int,
        default=1,
        metavar="N",
        help="how many seeded runs (a strong score needs 10 for cosmoflow)",
    )
    group.add_argument(
        "--first-seed",
        type=int,
        default=None,
        help="seeds are N, N+1, ... (default: the campaign's, else random)",
    )
    group.add_argument("--out", type=Path, required=True, help="where the submission directory goes")
    group.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted campaign in --out: keep its successful runs, rerun the rest",
    )
    group.add_argument(
        "--index",
        type=int,
        default=None,
        metavar="I",
        help="run result index I of the campaign alone (seed first-seed + I), straight into --out; "
        "refused when result_I.txt exists (with --resume: when it finished)",
    )
    group.add_argument(
        "--instances",
        type=int,
        default=1,
        metavar="K",
        help="weak scaling: train this many models at once, one per group of ranks "
        "(a single process launches the ranks itself, one per instance)",
    )


def _data_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--data", type=Path, default=None, help="dataset to stage (default: generate one)")
    group.add_argument(
        "--local-dir", type=Path, default=None, help="node-local staging dir (or MLHPC_LOCAL_DIR)"
    )
    group.add_argument("--allow-size", type=size_argument, default=None, metavar="SIZE", help=ALLOW_SIZE_HELP)
    group.add_argument(
        "--staging",
        choices=STAGINGS,
        default=DEFAULT_STAGING,
        help="stage inside run_start..run_stop before training (default, counts in the score), "
        "before run_start, or overlap: inside the run while training reads through the copy",
    )
    group.add_argument(
        "--io",
        choices=IO_CHOICES,
        default="auto",
        help="the staging copy's I/O path (see mlhpc stage --help)",
    )
    group.add_argument("--durable", action="store_true", help="have the staged copy on disk before training")
    group.add_argument(
        "--clear-cache", action="store_true", help="drop the page cache before each run (root)"
    )


def _submission_options(group: argparse._ArgumentGroup) -> None:
    later = "; later runs into --out follow the recorded one"
    group.add_argument("--submitter", default=None, help=f"default mlhpc{later}")
    group.add_argument(
        "--system",
        default=None,
        help=f"system name (default from the hardware: <cpu or gpu model>_<cpu|gpu>_n<ranks>){later}",
    )
    group.add_argument(
        "--division",
        choices=DIVISIONS,
        default=None,
        help="default closed, or open where the closed rules need the real dataset (deepcam mini)",
    )
    group.add_argument("--status", choices=STATUSES, default=None, help="default onprem")
    group.add_argument("--ruleset", choices=RULESETS, default=None, help=f"default {DEFAULT_RULESET}")
    group.add_argument(
        "--campaign",
        type=Path,
        default=None,
        metavar="FILE",
        help="a campaign.json giving the submission-wide settings (submitter, system, division, ...)",
    )
    group.add_argument("--no-check", action="store_true", help="skip `mlhpc check` at the end")


def _runtime_options(group: argparse._ArgumentGroup) -> None:
    from mlhpc.campaign.options import Backend, Device  # here: other commands start without them

    group.add_argument("--backend", choices=get_args(Backend), default="auto")
    group.add_argument("--device", choices=get_args(Device), default="auto")
    group.add_argument(
        "--power",
        action="store_true",
        help="sample each node's GPU (NVML) and CPU package (RAPL) power while a run is timed, into "
        "power/result_<i>/node_<host>.txt beside the result; mlhpc check scores the energy",
    )
    group.add_argument(
        "--mllog-stdout",
        action="store_true",
        help="also print the MLLOG events on stdout, as the reference trainers do (they always go to "
        "the result files; the terminal shows one line per epoch)",
    )
    group.add_argument(
        "--seed-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the seed of each run trained here, one a line, to FILE (a new name ending in "
        ".seed) once they end: how run_and_time.sh learns the seed the planner gave",
    )


def _dry_run_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config (and --data) and print the MLLOG events up to init_stop and what will "
        "train, build nothing; no --data and no free space needed (it says what a run without --data "
        "would refuse); exit 0: the real run would start, 2: it would refuse (the line says why); "
        "with --slurm: print the job graph, submit nothing",
    )
    group.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --dry-run: write what will train (config, param_groups, lr_per_epoch) as JSON",
    )


def _slurm_options(group: argparse._ArgumentGroup) -> None:
    from mlhpc.campaign.containers import RUNTIMES

    group.add_argument("--slurm", action="store_true", help="submit the seeds as sbatch jobs and return")
    group.add_argument(
        "--slurm-nodes", type=int, default=1, metavar="N", help="nodes per seed job (default 1)"
    )
    group.add_argument(
        "--slurm-ntasks-per-node",
        type=int,
        default=1,
        metavar="N",
        help="ranks per node, one per GPU (default 1)",
    )
    group.add_argument(
        "--slurm-time", default="01:00:00", metavar="TIME", help="time limit per seed job (default 01:00:00)"
    )
    group.add_argument(
        "--slurm-partition", default=None, metavar="NAME", help="partition (default: the cluster's)"
    )
    group.add_argument(
        "--container",
        default=None,
        metavar="IMAGE",
        help="run every job's mlhpc inside this image (an Apptainer .sif, a pyxis image, a podman-hpc "
        "image, a Charliecloud folder); --out, --data and the node-local folder are bound in",
    )
    group.add_argument(
        "--container-runtime",
        default=None,
        choices=RUNTIMES,
        help="how to run --container (default: a .sif is Apptainer's, a .sqsh pyxis's)",
    )
    group.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="more sbatch options for every job, repeatable: --sbatch-arg=--account=abc",
    )


def _run(args: argparse.Namespace) -> int:
    from mlhpc.campaign.options import from_args
    from mlhpc.campaign.prepare import prepare
    from mlhpc.common.safeio.writable import check_writable_dir, local_dir_name, refuse_output_over_inputs

    # Built, checked and resolved once, here, for every route (local, weak, dry run, Slurm): a
    # login node refuses what a seed job would, before anything is locked, launched or recorded.
    if args.container is not None and not args.slurm:  # an option's misuse: before any import or check
        from mlhpc.common.errors import ConfigError

        raise ConfigError(
            "--container runs the Slurm jobs' mlhpc in an image; add --slurm, or run mlhpc in the image "
            "yourself (apptainer exec IMAGE mlhpc run ...)"
        )
    opts = from_args(args)
    prepared = prepare(opts)
    _refuse_before_anything(args, prepared)
    if prepared.resolved.info.workload == "automl":  # a search for a duration (AIPerf), not seeds to target
        from mlhpc.common.contract.catalog import load_object

        return int(load_object(prepared.resolved.info.runner)(args, prepared))
    seed_file = _check_output_flags(args, opts)
    # Staged copies under the dataset they copy would be read back as part of it.
    if opts.data is not None:
        refuse_output_over_inputs(prepared.local_root, [opts.data], local_dir_name(opts.local_dir), folder=True)
    if args.slurm:  # submit and return: the login node needs neither torch nor data
        from mlhpc.campaign.slurm import resources_from_args, run_slurm_campaign

        if not args.dry_run:
            check_writable_dir(opts.out, "--out")
        return run_slurm_campaign(prepared, resources_from_args(args), dry_run=args.dry_run)
    if args.dry_run:  # check the config (and --data), print the init events, build nothing
        from mlhpc.campaign.dry_run import dry_run

        return dry_run(prepared, args.json)
    # Up front, on every rank: a read-only --out or a MLHPC_LOCAL_DIR that is a file is one line now,
    # not a traceback after the first seed has trained.
    check_writable_dir(opts.out, "--out")
    check_writable_dir(prepared.local_root, local_dir_name(opts.local_dir))
    from mlhpc.common.cluster.launch import detect_launch

    if opts.instances > 1 and detect_launch().world_size == 1:
        from mlhpc.campaign.instances import launch_instances

        return launch_instances(opts)
    return _train_here(prepared, seed_file)


def _refuse_before_anything(args: argparse.Namespace, prepared: Prepared) -> None:
    """What is refused before --out is locked or written, so a refusal leaves nothing behind: a
    dataset to generate that would not fit, another benchmark's --data, and (off a login node,
    whose Python need not be the compute nodes') an environment the run cannot import."""
    opts = prepared.opts
    # A dry run here touches no data: it says what the size check would refuse. A Slurm campaign
    # generates in its data job: refused on the login node, before anything is queued.
    if not args.dry_run or args.slurm:
        refuse_surprise_size(prepared)
    if opts.data is not None and not args.dry_run:  # another benchmark's data: at once, not after imports
        from mlhpc.common.contract.data_kinds import other_layout

        other = other_layout(opts.data, opts.benchmark)
        if other is not None:
            from mlhpc.common.errors import DataError
            from mlhpc.common.printable import shown

            raise DataError(f"--data {shown(opts.data)}: {other}")
    if not args.slurm:
        from mlhpc.common.display.waiting import say_if_slow

        # torch, torchvision and the benchmark's imports: 3 s idle, 20 s on a busy machine. Said on
        # stdout with the run's progress (stderr keeps an error to its one line), by the first rank.
        first_rank = os.environ.get("RANK", "0") in ("", "0")
        what = f"checking the environment for {opts.benchmark} (importing torch)"
        with say_if_slow(what, stream=sys.stdout) if first_rank else contextlib.nullcontext():
            check_run_environment(prepared, device=not args.dry_run)


def _train_here(prepared: Prepared, seed_file: Path | None) -> int:
    """Run the campaign on this process's ranks; rank 0 prints what each run did."""
    from mlhpc.campaign.local import run_campaign
    from mlhpc.common.cluster.distributed import init_distributed
    from mlhpc.common.cluster.group import lost_rank_named, shutdown_distributed
    from mlhpc.common.display.debug_log import debug_log
    from mlhpc.common.safeio.fileio import atomic_write_text

    opts = prepared.opts
    ctx = init_distributed(opts.backend, opts.device)
    started = time.perf_counter()
    try:
        with (
            debug_log(opts.out, ctx.rank) as debug_file,  # libraries' warnings and INFO records
            lost_rank_named(ctx, "the run in progress was not recorded; launch the same way with --resume"),
        ):
            campaign = run_campaign(prepared, ctx)
    finally:
        shutdown_distributed()
    if ctx.is_main:
        if seed_file is not None:  # the seeds the planner gave, for run_and_time.sh's RESULT line
            atomic_write_text(seed_file, "".join(f"{seed}\n" for seed, _, _ in campaign.results))
        if campaign.kept and opts.index is None:  # an --index run resumes nothing
            print(f"\nresumed: kept the finished runs {campaign.kept}")
        print(f"\n{'seed':>10} {'status':>8} {'epochs':>6} {'minutes':>8} {'samples/s':>10}")
        for seed, result, _ in campaign.results:
            print(
                f"{seed:>10} {result.status:>8} {result.epochs:>6} {result.run_seconds / 60:>8.3f} "
                f"{result.train_samples_per_s:>10.1f}"
            )
        print(f"submission: {campaign.submitter_dir}  wall time {time.perf_counter() - started:.1f} s")
        if debug_file is not None and debug_file.exists():  # made only when something was logged
            print(f"debug log (warnings, details): {debug_file}")
    return campaign.check_status or 0


def _check_output_flags(args: argparse.Namespace, opts: RunOptions) -> Path | None:
    """--json writes a dry run's view of what will train, --seed-file the seeds of runs trained
    here; anywhere else either would be ignored, so it is refused. The real path --seed-file
    writes (not over the data or the campaign file, nor an existing file of another kind)."""
    from mlhpc.common.errors import ConfigError
    from mlhpc.common.printable import shown
    from mlhpc.common.safeio.writable import SEED_KIND, refuse_output_over_inputs

    if args.json is not None and (not args.dry_run or args.slurm):
        raise ConfigError(
            f"--json {shown(args.json)} writes what a dry run here will train; add --dry-run (without --slurm) "
            "or drop --json"
        )
    if args.seed_file is None:
        return None
    if args.dry_run or args.slurm or opts.instances > 1:
        raise ConfigError(
            f"--seed-file {shown(args.seed_file)} gets the seeds of strong-scaling runs trained here; "
            "drop --dry-run, --slurm or --instances, or drop --seed-file"
        )
    from mlhpc.campaign.plan import CAMPAIGN_FILE

    inputs = [opts.data, opts.out / CAMPAIGN_FILE, opts.campaign]
    return refuse_output_over_inputs(args.seed_file, inputs, "--seed-file", kind=SEED_KIND)


def check_run_environment(prepared: Prepared, device: bool = True) -> None:
    """Before anything is staged, generated or recorded: the benchmark's imports, torch and
    torchvision built for each other, DALI where the config asks, and (`device`) the device asked
    for; one line naming the versions and the fix (mlhpc doctor runs the same checks)."""
    from mlhpc.environment import check_environment

    device_asked = prepared.opts.device if device else "none"
    check_environment([prepared.benchmark], prepared.resolved.cfg, device_asked)


def refuse_surprise_size(prepared: Prepared) -> None:
    """A run without --data whose synthetic dataset would not fit, or is over 4 GiB without
    --allow-size, is one line naming the size and the free space (see generation.check_room)."""
    from mlhpc.generation import check_size

    if prepared.size is not None and prepared.generated_dir is not None:
        check_size(prepared.generated_dir, prepared.size, reuse_complete=True)


def resume_command(args: argparse.Namespace, program: str) -> str | None:
    """The command that finishes an interrupted `mlhpc run`: its own words with --resume added,
    shell-quoted; None where resuming means nothing (a dry run, a Slurm submission, weak scaling,
    which is timed as one job and cannot be resumed)."""
    import shlex

    if args.dry_run or args.slurm or args.instances > 1:
        return None
    words = list(args.argv)
    if "--resume" not in words:
        words.append("--resume")
    return shlex.join([*shlex.split(program), *words])
