"""A dataset folder's files read back for comparison."""

from __future__ import annotations

from pathlib import Path


def dataset_files(root: Path) -> dict[str, bytes]:
    """A dataset's files by relative path (bytes), without manifests and staging bookkeeping."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.name != "mlhpc_manifest.json"
    }
