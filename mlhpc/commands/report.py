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
    from mlhpc.benchmarks.aiperf.scoring import find_run
    from mlhpc.results.report import report_command

    aiperf_run = find_run(args.path)
    if aiperf_run is not None:  # an AIPerf run: its score over time and its trials
        from mlhpc.common.errors import ConfigError
        from mlhpc.results.aiperf import report_aiperf

        if args.csv is not None:
            raise ConfigError("--csv writes one row per timed run; an AIPerf run has --json and --plot")
        report_aiperf(aiperf_run, plot=args.plot, json_path=args.json)
        return 0

    report_command(args.path, plot=args.plot, json_path=args.json, csv_path=args.csv)
    return 0
