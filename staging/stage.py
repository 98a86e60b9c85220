"""Staging a dataset to node-local storage: plan, copy or exchange, verify, mark complete.

Every rank calls `stage_dataset` at the same point. Its phases end in agreements, so an error
on one rank stops every rank with that rank's message, and the completion marker is written
last, by local rank 0, only when every file of its node verified. Local rank 0 holds DEST's
lock throughout, so a second `mlhpc stage` into the same DEST is refused at once.

The rooms: `request` (what is asked, the copy options decided once, what was done), `source`
(the seam every read of SRC goes through), `manifest` (its listing), `destination` (DEST's lock,
ownership and room, and the end: the node's manifest, stale copies, the marker), `execute` (the
copies, the exchange or the extraction), `engine` (one file: read, hash, partial file, verify,
rename), `verify` (`mlhpc verify`). What SRC holds is read here first, by rank 0 once.

Permissions: a staged file keeps its source's permission bits (less setuid, setgid, sticky),
a staged folder its source folder's (plus the owner's rwx, which a rerun needs), so a private
dataset stays private on a shared node-local disk; the node's manifest and marker, written for
others to read, follow the umask.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.fileio import current_umask
from mlhpc.staging import archive as archives
from mlhpc.staging.comm import CallbackComm, Communicator, LostRankError, agree
from mlhpc.staging.destination import agree_destination, finish_node, lock_destination, refuse_overlap
from mlhpc.staging.engine import Staged, Work, forget_checked_dirs
from mlhpc.staging.execute import ReadFirst, stage_archive, stage_directory
from mlhpc.staging.journal import close_journal, read_journals
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest, scan_dataset
from mlhpc.staging.plan import node_files
from mlhpc.staging.request import CopyOptions, IoPlan, StageReport, StageRequest, decide_io
from mlhpc.staging.source import Source, weak_evidence

log = logging.getLogger(__name__)


def stage_dataset(
    request: StageRequest,
    comm: Communicator | None = None,
    *,
    described: tuple[Manifest, bool] | None = None,
    planned: Callable[[CopyOptions], None] | None = None,
    read_first: ReadFirst | None = None,
) -> StageReport:
    """Stage the dataset at `request.src` (a directory or a tar/tar.gz/tar.zst archive) into
    `request.dest`.

    Without `comm`, one rank alone stages (a `CallbackComm` lets the ranks of one node split the
    work, synchronised by its barrier). With a collective `Communicator`, `request.mode` says what
    each node ends with (see `plan`). A rerun skips what is staged and verified already.
    The copy options are decided once (`_plan_job`) and reach every writer unchanged.
    `described`: the source's manifest, read already (`describe_source`); `planned` is called
    with the copy options once DEST is locked and agreed, before any copy; `read_first` gives
    the files each node's training reads first, which a directory's copies then follow
    (`overlap.py`).
    """
    comm = comm or CallbackComm()
    src, dest = request.src, request.dest
    started = time.perf_counter()
    refuse_overlap(src, dest)
    forget_checked_dirs()
    with ExitStack() as locked:  # DEST's lock, held until the marker is written
        lock_destination(comm, src, dest, locked)
        job = _plan_job(request, comm, described)
        if planned is not None:
            planned(job.options)
        work, evidence, error = _copy(comm, request, job, read_first)
        totals = agree(comm, error, work.read_bytes)
        held = finish_node(
            comm,
            src,
            dest,
            job.options.mode,
            job.manifest if job.kind is None else None,
            work,
            job.options,
            request.durable,
            previous=evidence,
        )
        return _report(request, comm, job, work, held, job_read_bytes=sum(totals), started=started)


@dataclass(frozen=True)
class _Job:
    """What this node stages and how, decided once DEST is locked."""

    manifest: Manifest
    trusted: bool
    """The manifest has checksums to verify against (else it is a listing)."""
    kind: str | None
    """The archive's kind; None for a directory."""
    fresh: bool
    """DEST held nothing of an earlier staging."""
    io: IoPlan
    options: CopyOptions


def _plan_job(request: StageRequest, comm: Communicator, described: tuple[Manifest, bool] | None) -> _Job:
    """The mode the nodes can have, the source's manifest, DEST agreed on by every rank (its
    room checked), and the I/O path for this node's share."""
    src, dest, mode, topo = request.src, request.dest, request.mode, comm.topology
    if mode == "replicate" and topo.num_nodes > 1 and not comm.collective:
        log.warning(
            "replicate over %d nodes needs a Communicator; every node copies the source", topo.num_nodes
        )
        mode = "copy"
    manifest, trusted = described or describe_source(comm, src)
    kind = archives.archive_kind(src) if src.is_file() else None
    mine = node_files(manifest, mode, topo) if kind is None else []
    needed = needed_bytes(src, kind, manifest, mine)
    fresh, token = agree_destination(comm, dest, needed)
    rels = [f.path for f in mine]
    cached = Source(src.parent).cached_fraction([src.name]) if kind else Source(src).cached_fraction(rels)
    io = decide_io(request.io, needed, cached)
    log.debug("staging I/O: %s (%s)", io.label, io.reason)
    # a cached source is copied at CPU speed: threads beyond the CPUs only queue for them
    threads = min(request.workers, os.cpu_count() or 1) if io.source_cached else request.workers
    processes = max(1, min(request.processes or 1, threads))
    options = CopyOptions(
        mode=mode,
        algorithm=manifest.algorithm,
        decompress=request.decompress,
        umask=current_umask(),
        run_token=token,
        threads=-(-threads // processes),
        processes=processes,
        chunk_bytes=request.chunk_bytes,
        progress=request.progress and comm.rank == 0,
        claims=str(request.claims or ""),
    )
    return _Job(manifest=manifest, trusted=trusted, kind=kind, fresh=fresh, io=io, options=options)


def _copy(
    comm: Communicator, request: StageRequest, job: _Job, read_first: ReadFirst | None = None
) -> tuple[Work, dict[str, Staged] | None, str | None]:
    """This rank's copies, extraction or exchange; (what it did, what an earlier staging left in
    the journals, this rank's error). An error is returned, not raised, so that every rank learns
    it in the agreement that follows (a lost rank is raised: no agreement can be had)."""
    src, dest = request.src, request.dest
    error: str | None = None
    work = Work()
    evidence: dict[str, Staged] | None = None
    try:
        evidence = None if job.fresh else read_journals(dest)
        if job.kind is not None:
            manifest = job.manifest if job.trusted else None
            work = stage_archive(comm, src, job.kind, dest, manifest, evidence or {}, job.options)
        else:
            work = stage_directory(comm, src, dest, job.manifest, evidence, job.options, read_first)
    except LostRankError:
        raise
    except (StagingError, OSError) as e:
        error = str(e) if isinstance(e, StagingError) else f"cannot stage {src} to {dest}: {e}"
    finally:
        try:
            close_journal(str(dest))
        except StagingError as e:  # also when interrupted: the interruption goes on up, not this
            error = error or str(e)
    return work, evidence, error


def _report(
    request: StageRequest,
    comm: Communicator,
    job: _Job,
    work: Work,
    held: Manifest,
    *,
    job_read_bytes: int,
    started: float,
) -> StageReport:
    """What was staged: the node's files and bytes, this rank's share of the work, the I/O path."""
    warning = archives.unchecked_warning(request.src, job.kind)
    return StageReport(
        dest=request.dest,
        files=len(held.files),
        bytes=held.total_bytes,
        seconds=time.perf_counter() - started,
        mode=job.options.mode,
        copied_files=len(work.staged),
        skipped_files=work.skipped,
        read_bytes=work.read_bytes,
        job_read_bytes=job_read_bytes,
        node=comm.topology.node,
        num_nodes=comm.topology.num_nodes,
        io=job.io,
        durable=request.durable,
        checked_by="checksums" if job.trusted else "identity",
        warnings=tuple(w for w in [warning] if w and not job.trusted and job.kind),
    )


# ---------------------------------------------------------------- what SRC holds
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
    inode (`source.weak_evidence`, judged on the archive or the first file): each copy then records
    no identity (`source.recorded_identity`), so a restage decides on content."""
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
