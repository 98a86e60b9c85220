"""What staging reads first: the source's manifest (checksums to verify against) or its
listing, read by rank 0 and broadcast, and the bytes a node needs room for.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.staging import archive as archives
from mlhpc.staging.comm import Communicator
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest, scan_dataset
from mlhpc.staging.origin import weak_evidence

log = logging.getLogger(__name__)


def describe_source(comm: Communicator, src: Path) -> tuple[Manifest, bool]:
    """The source's manifest (trusted: checksums to verify against) or its listing; read by
    rank 0 and broadcast, so the shared file system is asked once."""
    if not comm.collective:
        return read_source(src)
    payload = None
    if comm.rank == 0:
        try:
            manifest, trusted = read_source(src)
            payload = json.dumps({"manifest": manifest.to_json(), "trusted": trusted}).encode()
        except StagingError as e:
            payload = json.dumps({"error": str(e)}).encode()
    data = json.loads(comm.broadcast(payload))
    if "error" in data:
        raise StagingError(data["error"])
    return Manifest.from_json(data["manifest"], src), bool(data["trusted"])


def read_source(src: Path) -> tuple[Manifest, bool]:
    """A directory's manifest (or its listing) or an archive's manifest (or an empty one)."""
    try:
        manifest, trusted = _read_source(src)
        _say_if_evidence_is_weak(src, manifest, trusted)
        return manifest, trusted
    except OSError as e:
        raise StagingError(
            f"cannot read staging source {e.filename or src} ({e.strerror or e}); check it and its permissions"
        ) from e


def _read_source(src: Path) -> tuple[Manifest, bool]:
    if src.is_dir():
        if (src / MANIFEST_NAME).is_file():
            manifest = Manifest.read(src / MANIFEST_NAME)
            refuse_linked_folders(src, manifest)
            return manifest, True
        return scan_dataset(src), False
    if src.is_file() and archives.archive_kind(src) is not None:
        sidecar = archives.sidecar_manifest(src)
        if sidecar.is_file():
            return Manifest.read(sidecar), True
        return Manifest("xxh3_128", ()), False
    if src.exists():
        raise StagingError(
            f"staging source {src} is neither a directory nor a .tar, .tar.gz or .tar.zst archive"
        )
    raise StagingError(f"staging source {src} is not a directory; pass --data DIR holding the dataset")


def _say_if_evidence_is_weak(src: Path, manifest: Manifest, trusted: bool) -> None:
    """One warning when SRC's files cannot prove themselves unchanged by size, timestamps and
    inode (`origin.weak_evidence`, judged on the archive or the first file): each copy then records
    no identity (`origin.recorded_identity`), so a restage decides on content."""
    first = src / manifest.files[0].path if src.is_dir() and manifest.files else src
    try:
        why = weak_evidence(os.stat(first))
    except OSError:
        return  # staging names what is wrong with it
    if why is None:
        return
    then = (
        "a restage keeps a copy only when it still has the manifest's checksum"
        if trusted
        else "a restage copies every file again (write a manifest with `mlhpc manifest SRC` to keep "
        "copies that still have its checksums)"
    )
    log.warning(
        "staging source %s: %s, so a file changed there can keep its size, timestamps and inode; %s",
        src,
        why,
        then,
    )


def refuse_linked_folders(src: Path, manifest: Manifest) -> None:
    """A manifest entry whose folder in SRC is a symbolic link is refused (it could lead out of
    SRC, and a listing never enters one): one lstat per folder, not per file."""
    real: set[str] = set()
    for entry in manifest.files:
        folder = entry.path.rpartition("/")[0]
        while folder and folder not in real:
            if os.path.islink(src / folder):
                raise StagingError(
                    f"{src / MANIFEST_NAME}: entry {entry.path!r} goes through {src / folder}, a symbolic "
                    "link; refused: put the files themselves under SRC and write the manifest again"
                )
            real.add(folder)
            folder = folder.rpartition("/")[0]


def needed_bytes(src: Path, kind: str | None, manifest: Manifest, mine: list[FileEntry]) -> int:
    if kind is not None:
        return archives.estimated_bytes(src, kind, manifest if manifest.files else None)
    return sum(f.size for f in mine)  # a lower bound when decompressing: a full disk is caught later
