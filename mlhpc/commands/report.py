"""`mlhpc report PATH`: where each run's time went (the work is mlhpc.results.report's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
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


def _report(args: argparse.Namespace) -> int:
    from mlhpc.results.report import report_command

    report_command(args.path, plot=args.plot, json_path=args.json, csv_path=args.csv)
    return 0
