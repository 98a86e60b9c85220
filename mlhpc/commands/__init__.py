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


def size_argument(text: str) -> int:
    """--allow-size's value (`9.9TB`, `500GB`, `4GiB`) in bytes, for argparse's `type=`."""
    from mlhpc.generation import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


ALLOW_SIZE_HELP = (
    "generate a synthetic dataset over 4 GiB up to this size, e.g. 9.9TB (without it, a larger one "
    "is refused, naming its size and the free space)"
)
