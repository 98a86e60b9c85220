"""Archive sources (tar, tar.gz, tar.zst): members checked for safety and extracted while staging.

An archive is one stream, so one rank per node extracts it. Its manifest is a sidecar file
`<archive>.mlhpc_manifest.json` or a member `mlhpc_manifest.json` at the archive's root;
without one, checksums are computed from the extracted bytes.

Nothing in an archive is trusted (as with `tarfile.data_filter`): member names and link targets
go through `common/safeio/safepath` (`check_member`, here); `extract` writes the members, never through
a symlink, links last and judged where they really land; the stream itself is read through
`archive_stream`, which fails the whole archive in one line naming the byte where it is damaged.
"""

from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path

import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import link_target, relative_path
from mlhpc.staging.archive_stream import open_archive
from mlhpc.staging.engine import PARTIAL_SUFFIX, SLICE_BYTES
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest
from mlhpc.staging.source import open_source

ARCHIVE_KINDS = {".tar": "tar", ".tar.gz": "gz", ".tgz": "gz", ".tar.zst": "zst", ".tzst": "zst"}


def archive_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, kind in sorted(ARCHIVE_KINDS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return kind
    return None


def sidecar_manifest(path: Path) -> Path:
    return path.with_name(f"{path.name}.{MANIFEST_NAME}")


def estimated_bytes(path: Path, kind: str, manifest: Manifest | None) -> int:
    """Extracted size for the free-space check: the manifest's, else the best the format tells."""
    if manifest is not None:
        return manifest.total_bytes
    size = path.stat().st_size
    if kind == "zst":
        import zstandard

        with open(open_source(path), "rb", closefd=True) as handle:
            try:
                content = zstandard.frame_content_size(handle.read(18))
            except zstandard.ZstdError:
                content = -1  # not a zstd frame: extraction names what is wrong with it
        if content > 0:
            return content
    return size  # a lower bound for a compressed archive; a full disk is still caught while writing


def unchecked_warning(path: Path, kind: str | None) -> str | None:
    """What a manifest-less archive of `kind` cannot promise, as one line; None when its format
    checks its own bytes (gzip's CRC-32 per member; zstd frames with a content checksum)."""
    if kind == "tar":
        why = "a .tar carries no checksum of its members' bytes"
    elif kind == "zst":
        import zstandard

        try:
            with open(open_source(path), "rb", closefd=True) as handle:
                checked = zstandard.get_frame_parameters(handle.read(18)).has_checksum
        except (OSError, StagingError, zstandard.ZstdError):
            return None  # staging names what is wrong with it
        if checked:
            return None
        why = "its zstd frames carry no checksum (zstd --no-check)"
    else:
        return None
    return (
        f"{path} has no manifest and {why}: a damaged byte inside a member is staged unnoticed; "
        f"where the archive was made, write its checksums with: mlhpc manifest {path}"
    )


def check_member(member: tarfile.TarInfo, archive: Path) -> str | None:
    """The member's path inside DEST (None for the root), judged as text: its name, a link's
    target, its type. Where it really lands is judged when it is written (`landing`)."""
    where, fix = f"{archive}: member", "rebuild the archive without it"
    name = relative_path(member.name, where, fix, root_ok=True)
    where = f"{where} {member.name!r}"
    if member.issym():
        link_target(member.linkname, where, fix)
    elif member.islnk():
        relative_path(member.linkname, f"{where} links to", fix)
    elif not (member.isfile() or member.isdir()):
        raise StagingError(f"{where} is a device or FIFO; refused: {fix}")
    if name.endswith(PARTIAL_SUFFIX):
        raise StagingError(f"{where} has the name of a staging temporary file; refused: {fix}")
    return name or None


def member_node(path: str, num_nodes: int) -> int:
    """The node that holds archive member `path` in shard mode (by a hash of its path: an
    archive is streamed, so its members cannot be balanced by size before they are seen)."""
    return xxhash.xxh3_64_intdigest(path.encode()) % num_nodes


def build_archive_manifest(path: Path, algorithm: str = "xxh3_128") -> Manifest:
    """Hash every regular member of an archive (for `mlhpc manifest ARCHIVE`)."""
    from mlhpc.staging.manifest import new_hasher

    kind = archive_kind(path)
    if kind is None:
        raise StagingError(f"{path} is not a .tar, .tar.gz or .tar.zst archive")
    entries = {}
    with open(open_source(path), "rb", closefd=True) as raw, open_archive(raw, kind, path) as tar:
        for member in tar:
            name = check_member(member, path)
            if name is None or not member.isfile() or name == MANIFEST_NAME:
                continue
            if posixpath.basename(name).startswith(".mlhpc"):
                continue  # staging's own files: never extracted
            hasher = new_hasher(algorithm)
            handle = tar.extractfile(member)
            assert handle is not None
            while data := handle.read(SLICE_BYTES):
                hasher.update(data)
            entries[name] = FileEntry(name, member.size, hasher.hexdigest())  # a later copy wins
    return Manifest(algorithm, tuple(sorted(entries.values(), key=lambda f: f.path)))
