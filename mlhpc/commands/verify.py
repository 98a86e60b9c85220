"""`mlhpc verify DEST`: re-hash a staged copy against its manifest (reads only)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command, refuse_bad_counts

VERIFY_WORKERS = 8


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    verify_ = add_command(
        sub,
        "verify",
        "re-hash a staged copy against its manifest (reads only; a mismatch is one line and exit 2)",
        "mlhpc verify $MLHPC_LOCAL_DIR/cosmoflow",
    )
    verify_.add_argument("dest", type=Path, help="a folder `mlhpc stage` completed")
    verify_.add_argument(
        "--workers", type=int, default=VERIFY_WORKERS, help=f"files hashed at once ({VERIFY_WORKERS})"
    )
    verify_.set_defaults(handler=_verify)


def _verify(args: argparse.Namespace) -> int:
    refuse_bad_counts("verify", {"--workers": args.workers})
    return verify(args.dest, args.workers)


def verify(dest: Path, workers: int = VERIFY_WORKERS) -> int:
    """Re-hash `dest` against its manifest; a mismatch raises, naming the file (no lock needed)."""
    from mlhpc.staging.verify import verify_report

    count, source = verify_report(dest, workers=workers)
    print(f"{dest}: {count} files verified")
    print(source)
    return 0
