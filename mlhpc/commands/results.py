"""`mlhpc results add|list|compare`: checked entries in one SQLite store (the work is
mlhpc.results.compare's)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mlhpc.commands import add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    results = add_command(
        sub,
        "results",
        "keep checked entries (ours and published rounds) in one SQLite file and compare them",
        "mlhpc results add /data/hpc_results_v3.0 runs/mlhpc\n"
        "mlhpc results compare mlhpc/myhost_gpu_n1/strong/cosmoflow --report compare/",
    )
    what = results.add_subparsers(dest="results_command", required=True, metavar="ACTION")
    add = what.add_parser(
        "add",
        help="check folders and store their entries (re-adding replaces)",
        epilog="example:\n  mlhpc results add /data/hpc_results_v3.0 runs/mlhpc --db results.sqlite",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    listing = what.add_parser(
        "list",
        help="the stored entries",
        epilog="example:\n  mlhpc results list --benchmark cosmoflow --db results.sqlite",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("--benchmark", default=None)
    compare = what.add_parser(
        "compare",
        help="one entry against the published ones of its benchmark",
        epilog="example:\n  mlhpc results compare mlhpc/myhost_gpu_n1/strong/cosmoflow --report compare/ --all",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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

    from mlhpc.results import compare as command
    from mlhpc.results.store import default_db

    db = args.db or default_db()
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 200  # a log file has room; rich would squeeze the table into 80
    if args.results_command == "add":
        return command.add_command(args.dirs, db, args.origin, args.jobs, out)
    if args.results_command == "list":
        return command.list_command(db, args.benchmark, out)
    if args.report is not None:
        from mlhpc.common.safeio.writable import check_writable_dir

        check_writable_dir(args.report, "--report")
    return command.compare_command(db, args.entry, args.report, out, show_all=args.all)
