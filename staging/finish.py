"""The end of a staging: each node's manifest and sources file, the copies of removed files
taken away (our own, unchanged), strangers refused, and the completion marker written last.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.safepath import landing
from mlhpc.staging.comm import Communicator, agree
from mlhpc.staging.destination import STAGED_MARKER, destination_error, folder_mode, run_tokens
from mlhpc.staging.engine import PARTIAL_SUFFIX, Staged, staged_path, write_error
from mlhpc.staging.execute import Work
from mlhpc.staging.journal import read_journals, remove_journals, write_sources
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, hash_file
from mlhpc.staging.plan import Mode, node_files
from mlhpc.staging.request import CopyOptions


def finish_node(
    comm: Communicator,
    src: Path,
    dest: Path,
    mode: Mode,
    manifest: Manifest | None,
    work: Work,
    options: CopyOptions,
    durable: bool = False,
    previous: dict[str, Staged] | None = None,
) -> Manifest:
    """Local rank 0 writes the node's manifest (from every rank's journal); in replicate mode
    the nodes compare digests of their copies; the marker is written last (`durable`: after
    the copy is on disk). Before it, the copies of files the source no longer has are removed
    (`remove_stale`: only our own, unchanged), and what every file was made from goes into the
    sources file, the evidence of the next restage and of `mlhpc verify`."""
    topo = comm.topology
    held: Manifest | None = None
    records: list[Staged] = []
    error: str | None = None
    if topo.local_rank == 0:
        held, records, error = _write_node_manifest(src, dest, mode, manifest, work, options, previous, topo)
    digests = agree(comm, error, [topo.node, held.digest() if held else None])
    if mode == "replicate" and comm.collective:
        first = {digest: node for node, digest in reversed(digests) if digest}
        if len(first) > 1:
            nodes = sorted(first.values())
            raise StagingError(
                f"the copies on nodes {nodes[0]} and {nodes[1]} differ (manifest digests); stage again"
            )
    if held is not None:
        error = _write_marker(src, dest, mode, topo, held, records, durable)
    agree(comm, error)  # a barrier that also tells every rank if a marker could not be written
    if held is None and (dest / MANIFEST_NAME).is_file():
        held = Manifest.read(dest / MANIFEST_NAME)
    return held or Manifest(options.algorithm, tuple(node_files(manifest, mode, topo)) if manifest else ())


def _write_node_manifest(
    src: Path,
    dest: Path,
    mode: Mode,
    manifest: Manifest | None,
    work: Work,
    options: CopyOptions,
    previous: dict[str, Staged] | None,
    topo: Any,
) -> tuple[Manifest | None, list[Staged], str | None]:
    """Local rank 0: the node's manifest written, after its folders got their source's modes and
    stale copies and strangers were dealt with; (the manifest, what each file was made from, the
    error to agree on)."""
    held: Manifest | None = None
    records: list[Staged] = []
    try:
        records = _node_records(dest, manifest, mode, topo, work, options)
        held = Manifest(options.algorithm, tuple(s.entry for s in records))
        if manifest is not None:
            keep_folder_modes(src, dest, (f.path for f in held.files))
        remove_stale(src, dest, previous or {}, {s.path for s in records}, options.algorithm)
        refuse_strangers(src, dest, {s.path for s in records})
        held.write(dest / MANIFEST_NAME)
    except StagingError as e:
        return held, records, str(e)
    except OSError as e:
        return held, records, str(destination_error(e, e.filename or dest / MANIFEST_NAME))
    return held, records, None


def _write_marker(
    src: Path, dest: Path, mode: Mode, topo: Any, held: Manifest, records: list[Staged], durable: bool
) -> str | None:
    """The sources file, the journals removed, then the completion marker, last (`durable`: after
    the copy is on disk); the error to agree on, if any."""
    try:
        write_sources(dest, records)  # before the journals go: their lines are in it
        remove_journals(dest, run_tokens(dest))
        if durable:
            sync_filesystem(dest)
        marker = {"source": str(src.absolute()), "mode": mode, "node": topo.node, "nodes": topo.num_nodes}
        marker |= {"files": len(held.files), "bytes": held.total_bytes}
        atomic_write_text(dest / STAGED_MARKER, json.dumps(marker) + "\n")
    except OSError as e:
        return str(write_error(e, str(dest / STAGED_MARKER)))
    return None


def _node_records(
    dest: Path, manifest: Manifest | None, mode: Mode, topo: Any, work: Work, options: CopyOptions
) -> list[Staged]:
    """What the node holds, with what each file was made from: an archive's extracted members,
    or for a directory the node's files as its ranks' journals (and an earlier run's) record them."""
    if manifest is None:
        return sorted(work.held or [], key=lambda s: s.path)
    records = work.records if work.records is not None else read_journals(dest)
    out: list[Staged] = []
    for f in node_files(manifest, mode, topo):
        record = records.get(f.path)
        if record is None or record.path != staged_path(f.path, options):
            raise StagingError(f"{f.path} was not staged to {dest}; stage again")
        out.append(record)
    return sorted(out, key=lambda s: s.path)


def keep_folder_modes(src: Path, dest: Path, paths: Iterable[str]) -> None:
    """Give the folders of the staged `paths` their source folders' modes (a stat of each folder
    of the source, not of each file)."""
    folders: set[str] = set()
    for path in paths:  # string splits: PurePosixPath.parents cost 19 us a file (0.19 s for 10,000)
        folder = path.rpartition("/")[0]
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    for folder in sorted(folders):
        try:
            mode = folder_mode(src / folder)
        except FileNotFoundError:
            continue  # a folder the source no longer has: the umask's default stays
        os.chmod(dest / folder, mode)


def remove_stale(src: Path, dest: Path, previous: dict[str, Staged], held: set[str], algorithm: str) -> None:
    """Remove the copies an earlier staging made of files the source no longer has (or this
    node no longer holds), so that DEST holds what SRC does. Only a copy that is provably ours
    goes: recorded by an earlier run and still the very bytes it recorded. Anything else at such
    a path is refused in one line, before the marker: mlhpc does not delete what it cannot
    prove it made. A file no run of ours recorded is not looked at."""
    seen: set[str] = set()
    for record in previous.values():
        if record.path in held or record.path in seen:
            continue
        seen.add(record.path)
        where = f"staging into {dest}: an earlier copy"
        target = landing(
            str(dest), record.path, where, "remove the link from DEST, or stage into a new folder"
        )
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # not a file, so not a copy of ours: left as it is
        if info.st_size != record.size or hash_file(Path(target), algorithm) != record.checksum:
            raise StagingError(
                f"{target} was staged from {src} earlier, which no longer has it, and it changed since; "
                f"move it out of {dest} (mlhpc removes only its own unchanged copies) and stage again"
            )
        os.unlink(target)


def refuse_strangers(src: Path, dest: Path, held: set[str]) -> None:
    """DEST must hold the dataset and nothing else: a regular file that neither the source has
    nor a run of ours recorded (someone's own file, or a copy whose journal line a kill lost
    and whose source went meanwhile) is not ours to remove, and a loader would read it as data:
    refused in one line, before the marker, with nothing removed."""
    for folder, _, filenames in os.walk(dest):  # does not follow links
        for name in filenames:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, dest).replace(os.sep, "/")
            if name.startswith(".mlhpc") or name.endswith(PARTIAL_SUFFIX) or relative in held:
                continue
            if relative == MANIFEST_NAME or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            raise StagingError(
                f"{dest} holds {relative}, which {src} does not have and no staging recorded; move it "
                f"out of {dest} (mlhpc removes only its own copies) and stage again"
            )


def sync_filesystem(folder: Path) -> None:
    """Put everything written to `folder`'s file system on disk (syncfs; sync where it is missing)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
