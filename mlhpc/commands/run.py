"""`mlhpc run`: its options and the handler that runs a campaign here, under torchrun, or on Slurm."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from mlhpc.campaign.options import Backend, Device
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
    from mlhpc.generation import SizeCheck


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    """Add run; its Slurm options only when it is the command (or for --help of the whole CLI)."""
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
    run.add_argument("--config", default="mini", help="mini, full, or a YAML path (default mini)")
    run.add_argument(
        "--seeds", type=int, default=1, help="seeded runs (a strong score needs 10 for cosmoflow)"
    )
    run.add_argument("--first-seed", type=int, default=None, help="seeds are N, N+1, ... (default random)")
    run.add_argument("--out", type=Path, required=True, help="where the submission directory goes")
    run.add_argument("--data", type=Path, default=None, help="dataset to stage (default: generate one)")
    run.add_argument(
        "--local-dir", type=Path, default=None, help="node-local staging dir (or MLHPC_LOCAL_DIR)"
    )
    run.add_argument("--allow-size", type=size_argument, default=None, metavar="SIZE", help=ALLOW_SIZE_HELP)
    settings = "; recorded in <out>/campaign.json, which later runs into --out follow"
    run.add_argument("--submitter", default=None, help=f"default mlhpc{settings}")
    run.add_argument(
        "--system",
        default=None,
        help=f"system name (default from the hardware: <cpu or gpu model>_<cpu|gpu>_n<ranks>){settings}",
    )
    run.add_argument(
        "--division",
        choices=DIVISIONS,
        default=None,
        help="default closed, or open where the closed rules need the real dataset (deepcam mini)",
    )
    run.add_argument("--status", choices=STATUSES, default=None)
    run.add_argument("--ruleset", choices=RULESETS, default=None, help=f"default {DEFAULT_RULESET}")
    run.add_argument(
        "--campaign",
        type=Path,
        default=None,
        metavar="FILE",
        help="a campaign.json giving the submission-wide settings (submitter, system, division, ...)",
    )
    run.add_argument(
        "--staging",
        choices=STAGINGS,
        default=DEFAULT_STAGING,
        help="stage inside run_start..run_stop (default, counts in the score) or before it",
    )
    run.add_argument(
        "--io",
        choices=IO_CHOICES,
        default="auto",
        help="the staging copy's I/O path (see mlhpc stage --help)",
    )
    run.add_argument("--durable", action="store_true", help="have the staged copy on disk before training")
    run.add_argument("--backend", choices=get_args(Backend), default="auto")
    run.add_argument("--device", choices=get_args(Device), default="auto")
    run.add_argument("--clear-cache", action="store_true", help="drop the page cache before each run (root)")
    run.add_argument("--no-check", action="store_true", help="skip `mlhpc check` at the end")
    run.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted campaign in --out: keep its successful runs, rerun the rest",
    )
    run.add_argument(
        "--index",
        type=int,
        default=None,
        metavar="I",
        help="run result index I of the campaign alone (seed first-seed + I), straight into --out; "
        "refused when result_I.txt exists (with --resume: when it finished)",
    )
    run.add_argument(
        "--instances",
        type=int,
        default=1,
        help="weak scaling: train this many models at once, one per group of ranks "
        "(a single process launches the ranks itself, one per instance)",
    )
    run.add_argument(
        "--power",
        action="store_true",
        help="sample each node's GPU (NVML) and CPU package (RAPL) power while a run is timed, into "
        "power/result_<i>/node_<host>.txt beside the result; mlhpc check scores the energy",
    )
    run.add_argument(
        "--mllog-stdout",
        action="store_true",
        help="also print the MLLOG events on stdout, as the reference trainers do (they always go to "
        "the result files; the terminal shows one line per epoch)",
    )
    run.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --dry-run: write what will train (config, param_groups, lr_per_epoch) as JSON",
    )
    run.add_argument(
        "overrides",
        nargs="*",
        default=[],  # without a default argparse lists key=value among the required arguments
        metavar="key=value",
        help="config overrides (optional), e.g. loop.max_epochs=20",
    )
    if command in (None, "run"):
        from mlhpc.campaign.slurm import add_slurm_arguments

        add_slurm_arguments(run)
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from mlhpc.campaign.options import check_options, from_args
    from mlhpc.campaign.plan import check_numbers
    from mlhpc.common.writable import check_writable_dir, local_dir_name, refuse_output_over_inputs
    from mlhpc.staging.localdir import resolve_local_dir

    # Built and checked once, here, for every route (local, weak, dry run, Slurm): a login node
    # refuses what a seed job would, before anything is locked, launched, submitted or recorded.
    opts = from_args(args)
    check_options(opts)
    check_numbers(seeds=opts.seeds, first_seed=opts.first_seed, index=opts.index)
    check_numbers(seeds=opts.instances, first_seed=opts.first_seed, index=None, flag="--instances")
    refuse_surprise_size(opts)  # before --out is locked or written: a refusal leaves nothing behind
    _check_json_flag(args)
    # Staged copies under the dataset they copy would be read back as part of it.
    if opts.data is not None:
        refuse_output_over_inputs(
            resolve_local_dir(opts.local_dir), [opts.data], local_dir_name(opts.local_dir), folder=True
        )
    if args.slurm:  # submit and return: the login node needs neither torch nor data
        from mlhpc.campaign.slurm import resources_from_args, run_slurm_campaign

        if not args.dry_run:
            check_writable_dir(opts.out, "--out")
        return run_slurm_campaign(opts, resources_from_args(args), dry_run=args.dry_run)
    if args.dry_run:  # check the config (and --data), print the init events, build nothing
        from mlhpc.campaign.dry_run import dry_run

        return dry_run(opts, args.json)
    # Up front, on every rank: a read-only --out or a MLHPC_LOCAL_DIR that is a file is one line now,
    # not a traceback after the first seed has trained.
    check_writable_dir(opts.out, "--out")
    check_writable_dir(resolve_local_dir(opts.local_dir), local_dir_name(opts.local_dir))
    from mlhpc.campaign.local import run_campaign
    from mlhpc.common.debug_log import debug_log
    from mlhpc.common.distributed import init_distributed, shutdown_distributed
    from mlhpc.common.launch import detect_launch

    if opts.instances > 1 and detect_launch().world_size == 1:
        return _launch_instances(opts)

    ctx = init_distributed(opts.backend, opts.device)
    started = time.perf_counter()
    try:
        with debug_log(opts.out, ctx.rank) as debug_file:  # libraries' warnings and INFO records
            campaign = run_campaign(opts, ctx)
    finally:
        shutdown_distributed()
    if ctx.is_main:
        if campaign.kept and opts.index is None:  # an --index run resumes nothing
            print(f"\nresumed: kept the finished runs {campaign.kept}")
        print(f"\n{'seed':>10} {'status':>8} {'epochs':>6} {'minutes':>8} {'samples/s':>10}")
        for seed, result, _ in campaign.results:
            print(
                f"{seed:>10} {result.status:>8} {result.epochs:>6} {result.run_seconds / 60:>8.3f} "
                f"{result.train_samples_per_s:>10.1f}"
            )
        print(f"submission: {campaign.org_dir}  wall time {time.perf_counter() - started:.1f} s")
        if debug_file is not None and debug_file.exists():  # made only when something was logged
            print(f"debug log (warnings, details): {debug_file}")
    return campaign.check_status or 0


def _check_json_flag(args: argparse.Namespace) -> None:
    """--json writes a dry run's view of what will train; anywhere else it would be ignored."""
    from mlhpc.common.errors import ConfigError
    from mlhpc.common.printable import shown

    if args.json is not None and (not getattr(args, "dry_run", False) or getattr(args, "slurm", False)):
        raise ConfigError(
            f"--json {shown(args.json)} writes what a dry run here will train; add --dry-run (without --slurm) "
            "or drop --json"
        )


def generated_size(opts: RunOptions) -> tuple[Path, SizeCheck] | None:
    """Where a run without --data generates its dataset and what it checks first (None with --data)."""
    if opts.data is not None:
        return None
    from mlhpc.campaign.io import resolve_config
    from mlhpc.campaign.plan import dataset_dir
    from mlhpc.generation import run_size_check

    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    name = resolved.info.name
    size = run_size_check(name, resolved.cfg, opts.config, opts.allow_size)
    return dataset_dir(opts.out, name, opts.config), size


def refuse_surprise_size(opts: RunOptions) -> None:
    """A run without --data whose synthetic dataset would not fit, or is over 4 GiB without
    --allow-size, is one line naming the size and the free space (see generation.check_room)."""
    from mlhpc.generation import check_size

    planned = generated_size(opts)
    if planned is not None:
        check_size(planned[0], planned[1], reuse_complete=True)


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


def _run_options(args: argparse.Namespace) -> RunOptions:
    """The options `args` hold (run_options.from_args; kept for the tests that build them so)."""
    from mlhpc.campaign.options import from_args

    return from_args(args)


def _launch_instances(opts: RunOptions) -> int:
    """Start one local rank per instance under torchrun with these options (`to_argv`, the check
    left out), then check the submission here (a failing check in a rank would read as a crashed
    worker)."""
    import os
    import subprocess
    from dataclasses import replace

    from mlhpc.common.termination import Terminated
    from mlhpc.submission_checker.command import CAMPAIGN_RULESET, check_command

    # Each rank chooses its threads from the CPUs it may use and the ranks beside it (common/threads).
    env = dict(os.environ)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    rank_argv = replace(opts, check=False).to_argv()
    command += [f"--nproc_per_node={opts.instances}", "-m", "mlhpc", *rank_argv]
    print(f"launching {opts.instances} local ranks, one per instance: {' '.join(command)}", flush=True)
    with subprocess.Popen(command, env=env) as launcher:
        try:
            status = launcher.wait()
        except KeyboardInterrupt as stop:
            # Pass the signal on: torchrun stops its ranks on it, where a SIGKILL would orphan them.
            launcher.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
            raise
    if status != 0 or not opts.check:
        return status
    from mlhpc.campaign.io import read_campaign_file
    from mlhpc.campaign.plan import CAMPAIGN_FILE

    recorded = read_campaign_file(opts.out / CAMPAIGN_FILE)  # the settings the ranks ran with
    assert recorded is not None, "the instances' rank 0 writes the campaign file"
    ruleset = recorded.settings.ruleset
    return check_command(
        opts.out / recorded.settings.submitter, ruleset=ruleset, ruleset_reason=CAMPAIGN_RULESET
    )
