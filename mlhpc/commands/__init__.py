"""The `mlhpc` subcommands that have grown their own module (options and handler together)."""

from __future__ import annotations

import argparse

RULESETS = ("1.0.0", "2.0.0", "3.0.0")


def add_command(
    sub: argparse._SubParsersAction, name: str, text: str, example: str
) -> argparse.ArgumentParser:
    """A subcommand with its one-line help and a worked example under --help."""
    return sub.add_parser(
        name,
        help=text,
        description=text,
        epilog=f"example:\n  {example.replace(chr(10), chr(10) + '  ')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
