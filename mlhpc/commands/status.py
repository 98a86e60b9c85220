"""`mlhpc status OUT`: a campaign's seeds as done, running, queued, failed or interrupted, and the
next command to run (the work is mlhpc.campaign.status's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    status = add_command(
        sub,
        "status",
        "where a campaign stands: each seed done, running, queued or failed, and the next command",
        "mlhpc status runs/",
    )
    status.add_argument("out", type=Path, help="the --out folder of `mlhpc run` (local or --slurm)")
    status.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    from mlhpc.campaign.status import campaign_status, next_command
    from mlhpc.common.printable import shown

    record, entries = campaign_status(args.out)
    settings = record.settings
    print(f"{shown(args.out)}: submitter {settings.submitter}, system {settings.system or '(not yet named)'}")
    for entry in entries:
        counts = [f"{entry.count(s)} {s}" for s in _STATES if entry.count(s)]
        print(
            f"{entry.key} --config {shown(entry.entry.config)}: {len(entry.seeds)} seeds, {', '.join(counts)}"
        )
        for seed in entry.seeds:
            detail = f"  {shown(seed.detail)}" if seed.detail else ""
            print(f"  result_{seed.index}  seed {seed.seed:<10}  {seed.state:<11}{detail}".rstrip())
    print(next_command(args.out, record, entries))
    return 0


_STATES = ("done", "running", "queued", "failed", "interrupted", "not started")
