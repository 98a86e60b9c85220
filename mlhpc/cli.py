"""The `mlhpc` command: generate, stage, run, check."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from mlhpc import __version__
from mlhpc.commands import ALLOW_SIZE_HELP, RULESETS, OneLineParser, add_command, size_argument
from mlhpc.commands import run as run_command
from mlhpc.commands import stage as stage_commands
from mlhpc.common.debug_log import configure_console
from mlhpc.common.errors import ConfigError, MlhpcError
from mlhpc.common.printable import shown


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
        # DataLoader workers die of the same group SIGTERM; torch's SIGCHLD handler would raise
        # "worker killed" over Terminated in the middle of the cleanup (a traceback, exit 1). A
        # Python no-op, not SIG_DFL: a SIGCHLD already pending would print "ignored due to race".
        signal.signal(signal.SIGCHLD, lambda *_: None)
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
            _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("MLHPC_DEBUG"))  # MLHPC_DEBUG=1: the traceback instead of one line
    configure_console(debug=debug)  # libraries' warnings: only into a run's debug log (or with debug)
    try:
        with _sigterm_raises():
            return int(args.handler(args) or 0)
    except MlhpcError as e:
        if debug:
            raise
        return _error(str(e) or type(e).__name__)
    except Terminated:
        print(stopped_line("terminated", args), file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(stopped_line("interrupted", args), file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as e:  # the last resort: whatever path a step could not read or write
        if debug:
            raise
        where = f"{e.filename}: " if e.filename is not None else ""
        return _error(f"{where}{e.strerror or e}; check that path (permissions, free space)")


def stopped_line(how: str, args: argparse.Namespace) -> str:
    """`mlhpc: interrupted`, and for a run the exact command that finishes it (one line)."""
    if getattr(args, "command", None) != "run":
        return f"mlhpc: {how}"
    command = run_command.resume_command(args, _program())
    if command is None or os.environ.get("RANK", "0") != "0":  # one rank tells it, not every one
        return f"mlhpc: {how}"
    if os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_PROCID"):  # a launcher started this rank
        return f"mlhpc: {how}; to finish the campaign, launch the same way with --resume: {command}"
    return f"mlhpc: {how}; to finish the campaign (finished runs are kept): {command}"


def _program() -> str:
    """How this process was started, as a shell would run it again: `mlhpc` (or the path typed),
    else `python -m mlhpc`."""
    import shlex

    first = sys.argv[0] if sys.argv else ""
    if Path(first).name == "mlhpc":
        return shlex.quote(first)
    return f"{shlex.quote(sys.executable)} -m mlhpc"


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command that ran, so that its error names it: `mlhpc results add`."""
    for dest in ("command", "results_command"):
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, dest, None) not in sub.choices:
            break
        parser = sub.choices[getattr(args, dest)]
    return parser


def _error(message: str) -> int:
    line = " ".join((message.strip().splitlines() or [message])[0].split())
    print(f"mlhpc: error: {shown(line)}", file=sys.stderr)  # names in it may come from outside
    return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` (the one about to run), the options of the others
    that need heavy imports (run's Slurm options, stage-bench's) are left out: `mlhpc stage`
    starts without importing the Slurm campaign or the benchmark tools."""
    parser = OneLineParser(
        prog="mlhpc",
        description="MLPerf-HPC-style time-to-train: generate data, stage it, train to target, check.",
        epilog="example: mlhpc run cosmoflow --config mini --seeds 10 --out runs/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mlhpc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = add_command(
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
    gen.add_argument("--allow-size", type=size_argument, default=None, metavar="SIZE", help=ALLOW_SIZE_HELP)
    gen.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides (optional)")
    gen.set_defaults(handler=_generate)

    stage_commands.add_parsers(sub, command)
    run_command.add_parser(sub, command)

    check = add_command(
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

    variability = add_command(
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

    report = add_command(
        sub,
        "report",
        "where each run's time went: init, staging, data wait, forward, backward, ... and FLOP/s",
        "mlhpc report runs/ --plot breakdown.png",
    )
    report.add_argument("path", type=Path, help="the --out folder of `mlhpc run`, or one breakdown file")
    report.add_argument("--plot", type=Path, default=None, help="write a stacked bar per run as PNG")
    report.add_argument("--json", type=Path, default=None, help="write every run's figures as JSON")
    report.add_argument("--csv", type=Path, default=None, help="write one CSV row per run")
    report.set_defaults(handler=_report)
    _add_results_parser(sub)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from mlhpc.common import catalog
    from mlhpc.common.config import load_config
    from mlhpc.common.writable import check_writable_dir
    from mlhpc.generation import SizeCheck, check_size, dataset_bytes, generate_dataset

    if args.samples is not None and args.samples < 1:
        raise ConfigError(
            f"--samples {args.samples}: a dataset needs at least 1 training sample; pass --samples 1 "
            "or more, or leave it out for the config's data.num_train_samples"
        )
    info = catalog.info(args.benchmark)
    cfg = load_config(info.config_class, info.config_path(args.config), args.overrides)
    check_writable_dir(args.out, "--out")
    size = SizeCheck(
        expected=dataset_bytes(info.name, cfg, args.samples),
        allow=args.allow_size,
        what=f"mlhpc generate {info.name} --config {args.config}",
        fix="pass --samples N for a smaller one",
    )
    check_size(args.out, size, reuse_complete=False)  # before torch is imported: a refusal is quick
    from mlhpc.common import registry

    bench = registry.get(info.name)
    started = time.perf_counter()
    generate_dataset(
        args.out,
        lambda folder: bench.generate(cfg, folder, num_samples=args.samples, seed=args.seed),
        reuse_complete=False,
        not_ours_fix="pass a new or empty --out, or move them away",
        size=size,
    )
    print(f"wrote {bench.name} data to {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


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

    report_command(args.path, plot=args.plot, json_path=args.json, csv_path=args.csv)
    return 0


def _add_results_parser(sub: argparse._SubParsersAction) -> None:
    results = add_command(
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
    compare.add_argument("--all", action="store_true", help="also entries of unlike scale or config, marked")
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
    return command.compare_command(db, args.entry, args.report, out, show_all=args.all)


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
