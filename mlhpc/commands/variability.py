"""`mlhpc variability PATH`: a campaign's run-to-run variability (the work is mlhpc.results.variability's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command
from mlhpc.common.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
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


def _variability(args: argparse.Namespace) -> int:
    from mlhpc.results.variability import variability_command

    if not args.difference > 0:
        raise ConfigError(f"--difference {args.difference} must be positive; e.g. 0.05 for 5 %")
    if not 0 < args.confidence < 1:
        raise ConfigError(f"--confidence {args.confidence} must be between 0 and 1; e.g. 0.95")
    variability_command(args.path, difference=args.difference, confidence=args.confidence, plot=args.plot)
    return 0
