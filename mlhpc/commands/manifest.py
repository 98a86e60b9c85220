"""`mlhpc manifest SRC`: a dataset's checksums, which staging and verify check against."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command, refuse_bad_counts
from mlhpc.common.vocabulary import STAGING_WORKERS


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    manifest = add_command(
        sub,
        "manifest",
        "write a dataset's manifest: the checksums that staging and verify check against",
        "mlhpc manifest /lustre/cosmoflow              # writes /lustre/cosmoflow/mlhpc_manifest.json\n"
        "mlhpc manifest /lustre/cosmoflow.tar.zst      # writes a sidecar beside the archive",
    )
    manifest.add_argument("src", type=Path, help="dataset directory (the manifest goes in it) or archive")
    manifest.add_argument(
        "--workers", type=int, default=STAGING_WORKERS, help=f"files hashed at once ({STAGING_WORKERS})"
    )
    manifest.set_defaults(handler=_manifest)


def _manifest(args: argparse.Namespace) -> int:
    refuse_bad_counts("manifest", {"--workers": args.workers})
    return write_manifest(args.src, args.workers)


def write_manifest(src: Path, workers: int) -> int:
    """Write `src`'s manifest: a folder's in it, an archive's beside it (its sidecar)."""
    from mlhpc.staging import MANIFEST_NAME, build_manifest
    from mlhpc.staging.archive import archive_kind, build_archive_manifest, sidecar_manifest

    if archive_kind(src) is not None:
        build_archive_manifest(src).write(written := sidecar_manifest(src))
    else:
        build_manifest(src, workers=workers).write(written := src / MANIFEST_NAME)
    print(f"wrote {written}")
    return 0
