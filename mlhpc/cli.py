"""The `mlhpc` command: generate, stage, run, check."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc import __version__
from mlhpc.common.errors import ConfigError, MlhpcError
from mlhpc.staging.plan import MODES
from mlhpc.staging.stage import DEFAULT_WORKERS

if TYPE_CHECKING:
    from mlhpc.runner import RunOptions

RULESETS = ("1.0.0", "2.0.0", "3.0.0")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, `kill`), raised like Ctrl-C so that `finally` blocks run."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated in this process's main thread while the command runs.

    Installed by `main` only: a library caller and torch's launchers keep their own handlers, and
    a child forked meanwhile dies of SIGTERM as it would without us.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((w for w in words if not w.startswith("-")), None))
    # key=value overrides may come before or after options, so collect the leftovers here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(item.startswith("-") or "=" not in item for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    debug = bool(os.environ.get("MLHPC_DEBUG"))  # MLHPC_DEBUG=1: the traceback instead of one line
    try:
        with _sigterm_raises():
            return int(args.handler(args) or 0)
    except MlhpcError as e:
        if debug:
            raise
        return _error(str(e) or type(e).__name__)
    except Terminated:
        print("mlhpc: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("mlhpc: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as e:  # the last resort: whatever path a step could not read or write
        if debug:
            raise
        where = f"{e.filename}: " if e.filename is not None else ""
        return _error(f"{where}{e.strerror or e}; check that path (permissions, free space)")


def _error(message: str) -> int:
    line = " ".join((message.strip().splitlines() or [message])[0].split())
    print(f"mlhpc: error: {line}", file=sys.stderr)
    return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` (the one about to run), the options of the others
    that need heavy imports (run's Slurm options, stage-bench's) are left out: `mlhpc stage`
    starts without importing the Slurm campaign or the benchmark tools."""
    parser = argparse.ArgumentParser(
        prog="mlhpc",
        description="MLPerf-HPC-style time-to-train: generate data, stage it, train to target, check.",
        epilog="example: mlhpc run cosmoflow --config mini --seeds 10 --out runs/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mlhpc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = _command(
        sub,
        "generate",
        "write synthetic data in the benchmark's real on-disk format",
        "mlhpc generate cosmoflow --config mini --out data/cosmoflow-mini",
    )
    gen.add_argument("benchmark")
    gen.add_argument("--config", default="mini", help="mini, full, or a YAML path (default mini)")
    gen.add_argument("--out", type=Path, required=True, help="dataset directory to write")
    gen.add_argument("--samples", type=int, default=None, help="training samples (default: the config's)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("overrides", nargs="*", metavar="key=value")
    gen.set_defaults(handler=_generate)

    stage = _command(
        sub,
        "stage",
        "copy a dataset (directory or tar/tar.gz/tar.zst) to node-local storage, verified",
        "mlhpc stage /lustre/cosmoflow $MLHPC_LOCAL_DIR/cosmoflow\n"
        "srun -N 8 --ntasks-per-node=1 mlhpc stage /lustre/cosmoflow.tar.zst /local/cosmoflow --mode replicate\n"
        "torchrun --nproc_per_node=2 -m mlhpc stage data/ /tmp/node{node} --each-rank-a-node --mode shard",
    )
    stage.add_argument("src", type=Path, help="dataset directory or archive")
    stage.add_argument(
        "dest", type=Path, nargs="?", help="node-local directory; {node} becomes the node index"
    )
    stage.add_argument(
        "--mode",
        choices=MODES,
        default="replicate",
        help="replicate: every node gets all, the source is read once (default); shard: each node 1/N; "
        "copy: every node reads all",
    )
    stage.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help=f"parallel copies per rank ({DEFAULT_WORKERS})"
    )
    stage.add_argument("--processes", type=int, default=None, help="worker processes per rank (default auto)")
    stage.add_argument("--decompress", action="store_true", help="decompress .gz/.zst files while staging")
    stage.add_argument(
        "--io",
        choices=("auto", "buffered", "direct", "kernel"),
        default="auto",
        help="auto: page cache when the node's share fits in memory or the source is cached, else O_DIRECT; "
        "kernel: the page cache, large files copied in the kernel (copy_file_range)",
    )
    stage.add_argument("--no-direct-io", action="store_true", help="the same as --io buffered")
    stage.add_argument("--durable", action="store_true", help="have the copy on disk before the marker (syncfs)")
    stage.add_argument("--chunk-mib", type=int, default=16, help="exchange chunk per node and round")
    stage.add_argument("--comm", choices=("auto", "torch", "mpi"), default="auto", help="collectives backend")
    stage.add_argument(
        "--each-rank-a-node", action="store_true", help="treat every rank as a node (one-machine study)"
    )
    stage.add_argument(
        "--verify", action="store_true", help="only re-hash DEST against its manifest (also: --verify DEST)"
    )
    stage.add_argument(
        "--make-manifest", action="store_true", help="write SRC's manifest (checksums to verify against)"
    )
    stage.set_defaults(handler=_stage)

    bench = _command(
        sub,
        "stage-bench",
        "measure staging throughput against cp, tar and the raw disk (CSV, PNG, markdown)",
        "mlhpc stage-bench --out runs/stage-bench --total-mib 512 --file-kib 64,1024,65536",
    )
    if command in (None, "stage-bench"):
        from mlhpc.staging.bench import add_bench_arguments

        add_bench_arguments(bench)
    bench.set_defaults(handler=_stage_bench)

    run = _command(
        sub,
        "run",
        "stage, train each seed to target, write and check a submission",
        "mlhpc run cosmoflow --config mini --seeds 10 --out runs/\n"
        "mlhpc run cosmoflow --config mini --seeds 10 --out runs/ --resume   # after an interruption\n"
        "mlhpc run cosmoflow --config mini --instances 10 --out runs/weak   # weak scaling\n"
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
    run.add_argument("--submitter", default="mlhpc")
    run.add_argument("--system", default=None, help="system name (default <host>_<cpu|gpu>_n<ranks>)")
    run.add_argument(
        "--division",
        choices=("closed", "open"),
        default=None,
        help="default closed, or open where the closed rules need the real dataset (deepcam mini)",
    )
    run.add_argument("--status", choices=("onprem", "cloud", "preview", "research"), default="onprem")
    run.add_argument("--ruleset", choices=RULESETS, default="3.0.0")
    run.add_argument(
        "--staging",
        choices=("inside", "before"),
        default="inside",
        help="stage inside run_start..run_stop (default, counts in the score) or before it",
    )
    run.add_argument(
        "--io",
        choices=("auto", "buffered", "direct", "kernel"),
        default="auto",
        help="the staging copy's I/O path (see mlhpc stage --help)",
    )
    run.add_argument("--durable", action="store_true", help="have the staged copy on disk before training")
    run.add_argument("--backend", choices=("auto", "gloo", "nccl", "horovod"), default="auto")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    run.add_argument("--clear-cache", action="store_true", help="drop the page cache before each run (root)")
    run.add_argument("--no-check", action="store_true", help="skip `mlhpc check` at the end")
    run.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted campaign in --out: keep its successful runs, rerun the rest",
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
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. loop.max_epochs=20",
    )
    if command in (None, "run"):
        from mlhpc.slurm_campaign import add_slurm_arguments

        add_slurm_arguments(run)
    run.set_defaults(handler=_run)

    check = _command(
        sub,
        "check",
        "validate and score a submission directory (read-only)",
        "mlhpc check runs/mlhpc --json score.json",
    )
    check.add_argument("path", type=Path, help="an organisation's directory or a folder of them")
    check.add_argument("--ruleset", choices=RULESETS, default=None, help="default: detected from the logs")
    check.add_argument("--json", type=Path, default=None, help="write the report as JSON")
    check.add_argument("--csv", type=Path, default=None, help="write one CSV row per entry")
    check.add_argument("--report", type=Path, default=None, metavar="DIR", help="write DIR/index.html")
    check.add_argument("--jobs", type=int, default=None, help="parallel compliance checks")
    check.set_defaults(handler=_check)

    variability = _command(
        sub,
        "variability",
        "run-to-run variability of a campaign: epochs and minutes to target, runs a comparison needs",
        "mlhpc variability runs/mlhpc --plot variability.png --difference 0.05",
    )
    variability.add_argument("path", type=Path, help="a campaign's --out, a results folder, or one log")
    variability.add_argument(
        "--difference", type=float, default=0.05, help="relative gap to detect (default 0.05)"
    )
    variability.add_argument("--confidence", type=float, default=0.95, help="two-sided (default 0.95)")
    variability.add_argument("--plot", type=Path, default=None, help="write the distributions as PNG")
    variability.set_defaults(handler=_variability)

    report = _command(
        sub,
        "report",
        "where each run's time went: init, staging, data wait, forward, backward, ... and FLOP/s",
        "mlhpc report runs/ --plot breakdown.png",
    )
    report.add_argument("path", type=Path, help="the --out folder of `mlhpc run`, or one breakdown file")
    report.add_argument("--plot", type=Path, default=None, help="write a stacked bar per run as PNG")
    report.set_defaults(handler=_report)
    _add_results_parser(sub)
    return parser


def _command(sub: argparse._SubParsersAction, name: str, text: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=text,
        description=text,
        epilog=f"example:\n  {example.replace(chr(10), chr(10) + '  ')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _generate(args: argparse.Namespace) -> int:
    from mlhpc.common import registry
    from mlhpc.common.config import load_config
    from mlhpc.common.writable import check_writable_dir
    from mlhpc.generation import generate_dataset

    if args.samples is not None and args.samples < 1:
        raise ConfigError(
            f"--samples {args.samples}: a dataset needs at least 1 training sample; pass --samples 1 "
            "or more, or leave it out for the config's data.num_train_samples"
        )
    bench = registry.get(args.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(args.config), args.overrides)
    check_writable_dir(args.out, "--out")
    started = time.perf_counter()
    generate_dataset(
        args.out,
        lambda folder: bench.generate(cfg, folder, num_samples=args.samples, seed=args.seed),
        reuse_complete=False,
        not_ours_fix="pass a new or empty --out, or move them away",
    )
    print(f"wrote {bench.name} data to {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


def _stage(args: argparse.Namespace) -> int:
    from mlhpc.staging import MANIFEST_NAME, build_manifest, make_comm, stage_dataset, verify_staged
    from mlhpc.staging.archive import archive_kind, build_archive_manifest, sidecar_manifest

    counts = {"--workers": args.workers, "--processes": args.processes, "--chunk-mib": args.chunk_mib}
    for flag, value in counts.items():
        if value is not None and value < 1:  # refused before any work, not met deep in a pool
            raise ConfigError(f"mlhpc stage {flag} {value}: it must be at least 1; pass {flag} 1 or more")
    if args.make_manifest:
        if archive_kind(args.src) is not None:
            build_archive_manifest(args.src).write(written := sidecar_manifest(args.src))
        else:
            build_manifest(args.src, workers=args.workers).write(written := args.src / MANIFEST_NAME)
        print(f"wrote {written}")
        return 0
    if args.verify:  # `mlhpc stage --verify DEST` or `mlhpc stage SRC DEST --verify`; no lock needed
        dest = args.src if args.dest is None else args.dest
        count = verify_staged(dest)
        print(f"{dest}: {count} files verified")
        return 0
    if args.dest is None:
        raise ConfigError("mlhpc stage needs DEST (or --make-manifest); see mlhpc stage --help")
    comm = make_comm(args.comm, each_rank_a_node=args.each_rank_a_node)
    dest = Path(str(args.dest).replace("{node}", str(comm.topology.node)))
    try:
        report = stage_dataset(
            args.src,
            dest,
            comm=comm,
            mode=args.mode,
            workers=args.workers,
            processes=args.processes,
            decompress=args.decompress,
            io="buffered" if args.no_direct_io else args.io,
            durable=args.durable,
            chunk_bytes=args.chunk_mib << 20,
            progress=True,
        )
    finally:
        comm.close()
    if comm.rank == 0:
        rate = report.bytes / max(report.seconds, 1e-9) / 1e6
        print(
            f"staged {report.files} files, {report.bytes} bytes to {report.dest} in {report.seconds:.2f} s "
            f"({rate:.0f} MB/s; mode {report.mode}, {report.num_nodes} node(s)); copied {report.copied_files}, "
            f"skipped {report.skipped_files} already staged; the job read {report.job_read_bytes} source bytes; "
            f"I/O {report.io.label if report.io else '-'}"
        )
    return 0


def _stage_bench(args: argparse.Namespace) -> int:
    from mlhpc.staging.bench import run_bench

    return run_bench(args)


def _run(args: argparse.Namespace) -> int:
    from mlhpc.common.writable import check_writable_dir, local_dir_name
    from mlhpc.staging.localdir import resolve_local_dir

    for name in ("seeds", "instances"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} {getattr(args, name)} must be at least 1; pass --{name} 1 or more")
    if args.slurm:  # submit and return: the login node needs neither torch nor data
        from mlhpc.slurm_campaign import run_slurm_campaign

        if not args.dry_run:
            check_writable_dir(args.out, "--out")
        return run_slurm_campaign(args)
    if args.dry_run:  # check the config (and --data), print the init events, build nothing
        from mlhpc.dry_run import dry_run

        return dry_run(_run_options(args), device=args.device)
    # Up front, on every rank: a read-only --out or a MLHPC_LOCAL_DIR that is a file is one line now,
    # not a traceback after the first seed has trained.
    check_writable_dir(args.out, "--out")
    check_writable_dir(resolve_local_dir(args.local_dir), local_dir_name(args.local_dir))
    from mlhpc.common.distributed import init_distributed, shutdown_distributed
    from mlhpc.common.launch import detect_launch
    from mlhpc.runner import run_campaign

    if args.instances > 1 and detect_launch().world_size == 1:
        return _launch_instances(args)

    opts = _run_options(args)
    ctx = init_distributed(args.backend, args.device)
    started = time.perf_counter()
    try:
        campaign = run_campaign(opts, ctx)
    finally:
        shutdown_distributed()
    if ctx.is_main:
        if campaign.kept:
            print(f"\nresumed: kept the finished runs {campaign.kept}")
        print(f"\n{'seed':>10} {'status':>8} {'epochs':>6} {'minutes':>8} {'samples/s':>10}")
        for seed, result, _ in campaign.results:
            print(
                f"{seed:>10} {result.status:>8} {result.epochs:>6} {result.run_seconds / 60:>8.3f} "
                f"{result.train_samples_per_s:>10.1f}"
            )
        print(f"submission: {campaign.org_dir}  wall time {time.perf_counter() - started:.1f} s")
    return campaign.check_status or 0


def _run_options(args: argparse.Namespace) -> RunOptions:
    from mlhpc.runner import RunOptions

    return RunOptions(
        benchmark=args.benchmark,
        config=args.config,
        overrides=tuple(args.overrides),
        seeds=args.seeds,
        first_seed=args.first_seed,
        out=args.out,
        data=args.data,
        local_dir=args.local_dir,
        submitter=args.submitter,
        system=args.system,
        division=args.division,
        status=args.status,
        ruleset=args.ruleset,
        staging=args.staging,
        staging_io=args.io,
        durable=args.durable,
        clear_cache=args.clear_cache,
        check=not args.no_check,
        resume=args.resume,
        instances=args.instances,
        power=args.power,
    )


def _launch_instances(args: argparse.Namespace) -> int:
    """Start one local rank per instance under torchrun with this same command line, then check
    the submission here (a failing check in a rank would read as a crashed worker)."""
    import os
    import subprocess

    from mlhpc.submission_checker.command import check_command

    threads = max(1, (os.cpu_count() or 1) // args.instances)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={args.instances}", "-m", "mlhpc", *args.argv, "--no-check"]
    print(f"launching {args.instances} local ranks, one per instance: {' '.join(command)}", flush=True)
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
    if status != 0 or args.no_check:
        return status
    return check_command(args.out / args.submitter, ruleset=args.ruleset)


def _variability(args: argparse.Namespace) -> int:
    from mlhpc.variability import variability_command

    if not args.difference > 0:
        raise ConfigError(f"--difference {args.difference} must be positive; e.g. 0.05 for 5 %")
    if not 0 < args.confidence < 1:
        raise ConfigError(f"--confidence {args.confidence} must be between 0 and 1; e.g. 0.95")
    variability_command(args.path, difference=args.difference, confidence=args.confidence, plot=args.plot)
    return 0


def _report(args: argparse.Namespace) -> int:
    from mlhpc.report import report_command

    report_command(args.path, plot=args.plot)
    return 0


def _add_results_parser(sub: argparse._SubParsersAction) -> None:
    results = _command(
        sub,
        "results",
        "keep checked entries (ours and published rounds) in one SQLite file and compare them",
        "mlhpc results add /data/hpc_results_v3.0 runs/mlhpc\n"
        "mlhpc results compare mlhpc/myhost_gpu_n1/strong/cosmoflow --report compare/",
    )
    what = results.add_subparsers(dest="results_command", required=True, metavar="ACTION")
    add = what.add_parser("add", help="check folders and store their entries (re-adding replaces)")
    add.add_argument(
        "dirs", type=Path, nargs="+", metavar="DIR", help="an organisation's folder or a round's"
    )
    add.add_argument(
        "--origin",
        choices=("auto", "published", "ours"),
        default="auto",
        help="auto: published when the folder is named for a round (hpc_results_v3.0)",
    )
    add.add_argument("--jobs", type=int, default=None, help="parallel compliance checks")
    listing = what.add_parser("list", help="the stored entries")
    listing.add_argument("--benchmark", default=None)
    compare = what.add_parser("compare", help="one entry against the published ones of its benchmark")
    compare.add_argument("entry", help="an id (see list) or submitter/system/scaling/benchmark")
    compare.add_argument("--report", type=Path, default=None, metavar="DIR", help="write DIR/index.html")
    for action in (add, listing, compare):
        action.add_argument(
            "--db",
            type=Path,
            default=None,
            help="the store (default $MLHPC_RESULTS_DB or ~/.local/share/mlhpc/results.sqlite)",
        )
    results.set_defaults(handler=_results)


def _results(args: argparse.Namespace) -> int:
    from rich.console import Console

    from mlhpc import results_command as command
    from mlhpc.results_store import default_db

    db = args.db or default_db()
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 200  # a log file has room; rich would squeeze the table into 80
    if args.results_command == "add":
        return command.add_command(args.dirs, db, args.origin, args.jobs, out)
    if args.results_command == "list":
        return command.list_command(db, args.benchmark, out)
    if args.report is not None:
        from mlhpc.common.writable import check_writable_dir

        check_writable_dir(args.report, "--report")
    return command.compare_command(db, args.entry, args.report, out)


def _check(args: argparse.Namespace) -> int:
    from mlhpc.submission_checker.command import check_command

    return check_command(
        args.path,
        ruleset=args.ruleset,
        json_path=args.json,
        csv_path=args.csv,
        report_dir=args.report,
        jobs=args.jobs,
    )


if __name__ == "__main__":
    raise SystemExit(main())
