"""`mlhpc verify DEST`: a staged copy re-hashed against its manifest and checked against its
source as it is now (identity and manifest checksum of every file).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio import safe_json
from mlhpc.staging import archive as archives
from mlhpc.staging.engine import Staged
from mlhpc.staging.journal import STAGED_MARKER, read_sources
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_file, list_dataset_files
from mlhpc.staging.source import current_identity


def verify_staged(dest: Path, workers: int = 8) -> int:
    """Re-hash a staged directory against its manifest, and check its source where it is
    reachable (`check_source`); returns the file count, raises on a mismatch."""
    return verify_report(dest, workers)[0]


def verify_report(dest: Path, workers: int = 8) -> tuple[int, str]:
    """`verify_staged`, and one line saying what the source check could promise."""
    dest = Path(dest)
    if not (dest / STAGED_MARKER).is_file():
        raise StagingError(f"{dest} holds no complete staged dataset (no {STAGED_MARKER}); stage it again")
    manifest = Manifest.read(dest / MANIFEST_NAME)

    def check(entry: FileEntry) -> None:
        path = dest / entry.path
        try:
            size = path.stat().st_size if path.is_file() else -1
        except OSError:  # a rerun of the staging is replacing it
            size = -1
        if size != entry.size:
            raise StagingError(f"staged file {path} is missing or has the wrong size; stage again")
        fix = "a staged copy is a regular file; stage again"
        if hash_file(path, manifest.algorithm, fix) != entry.checksum:
            raise StagingError(f"staged file {path} is corrupt ({manifest.algorithm} mismatch); stage again")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(check, manifest.files))
    return len(manifest.files), check_source(dest, manifest, workers)


def check_source(dest: Path, held: Manifest, workers: int = 8) -> str:
    """Check a staged copy against its source as it is now: every file's source still has the
    identity it had when it was copied (size, mtime, ctime, inode, device; an archive's for its
    members), its manifest's checksum is still the one the copy was checked against, and a
    source of the whole dataset has no file the copy lacks. Raises on a difference, naming the
    file; returns one line on what was checked (or that the source is not reachable)."""
    try:
        marker = safe_json.load_file(dest / STAGED_MARKER, dict, max_bytes=1 << 20)
    except (OSError, ValueError) as e:
        raise StagingError(f"{dest / STAGED_MARKER}: cannot read the marker ({e}); stage again") from e
    source = marker.get("source")
    if not isinstance(source, str) or not source:
        return f"{dest}'s marker names no source: checked against its own manifest only"
    src = Path(source)
    if not src.exists():
        return f"source {src} is not reachable from here: checked against {dest}'s manifest only"
    records = read_sources(dest)
    now = _source_now(dest, src)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        unknown = sum(1 for verdict in pool.map(now.judge, records) if verdict)
    if marker.get("mode") != "shard" and now.kind is None:
        names = set(now.expected) if now.listed is not None else set(list_dataset_files(src))
        missing = sorted(names - {r.source for r in records})
        if missing and records:
            raise StagingError(
                f"{src} has {len(missing)} file(s) that {dest} lacks (first: {missing[0]}); stage again"
            )
    how = "manifest checksums and identity" if now.listed is not None else "size, mtime, ctime and inode"
    line = f"checked against source {src}: {len(records) - unknown} files unchanged since staged ({how})"
    return line + (f"; {unknown} without a record of their source (not checked)" if unknown else "")


@dataclass(frozen=True, kw_only=True)
class _SourceNow:
    """A staged copy's source as it is now, to judge each staged file's record against."""

    dest: Path
    src: Path
    kind: str | None
    """The archive's kind; None for a directory."""
    listed: Manifest | None
    """The source's manifest now (an archive's sidecar one); None without one."""
    listing: Path
    """Where that manifest is, or would be."""
    expected: dict[str, FileEntry]
    """That manifest's files by path."""
    archive_now: str
    """The archive's identity now ("" for a directory)."""

    def judge(self, record: Staged) -> str:
        """'' when the record's source is unchanged; 'unknown' when nothing can tell."""
        entry = self.expected.get(record.source)
        if self.listed is not None and (entry is None or entry.checksum != record.source_checksum):
            raise StagingError(
                f"staged file {self.dest / record.path} was copied from {record.source}, which "
                f"{self.listing} now lists {'with another checksum' if entry else 'no longer'}; stage again"
            )
        if not record.origin:
            return "" if entry is not None else "unknown"
        now = self.archive_now if self.kind is not None else current_identity(self.src / record.source)
        if now != record.origin:
            what = (
                f"the archive {self.src}"
                if self.kind is not None
                else f"its source {self.src / record.source}"
            )
            raise StagingError(
                f"staged file {self.dest / record.path} is stale: {what} changed or went since it was "
                "copied (size, mtime, ctime or inode); stage again"
            )
        return ""


def _source_now(dest: Path, src: Path) -> _SourceNow:
    kind = archives.archive_kind(src) if src.is_file() else None
    listing = archives.sidecar_manifest(src) if kind is not None else src / MANIFEST_NAME
    try:
        listed = Manifest.read(listing) if listing.is_file() else None
    except StagingError as e:
        raise StagingError(f"{e} (the source of {dest})") from e
    return _SourceNow(
        dest=dest,
        src=src,
        kind=kind,
        listed=listed,
        listing=listing,
        expected={f.path: f for f in listed.files} if listed is not None else {},
        archive_now=current_identity(src) if kind is not None else "",
    )
