"""`mlhpc check PATH`: validate and score a submission directory (the work is the checker's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import RULESETS, add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
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
    check.add_argument(
        "--short-campaign",
        action="store_true",
        help="a campaign's own check (what `mlhpc run --slurm`'s check job passes): an entry whose only "
        "error is fewer runs than a score needs is reported as not yet scoreable, exit 0",
    )
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from mlhpc.benchmarks.aiperf.scoring import check_run, find_run
    from mlhpc.campaign.status import short_campaign_line
    from mlhpc.submission_checker.command import check_command

    aiperf_run = find_run(args.path)
    if aiperf_run is not None:  # an AIPerf run: scored by its operations over time, not MLPerf's rules
        return check_run(aiperf_run, args.json)

    return check_command(
        args.path,
        ruleset=args.ruleset,
        json_path=args.json,
        csv_path=args.csv,
        report_dir=args.report,
        jobs=args.jobs,
        short_campaign=short_campaign_line if args.short_campaign else None,
    )
