"""Staging a dataset to node-local storage: plan, copy or exchange, verify, mark complete.

Every rank calls `stage_dataset` at the same point. Its phases end in agreements, so an error
on one rank stops every rank with that rank's message, and the completion marker is written
last, by local rank 0, only when every file of its node verified. Local rank 0 holds DEST's
lock throughout, so a second `mlhpc stage` into the same DEST is refused at once.

The rooms: `request` (what is asked, what was done), `source` (its manifest or listing),
`destination` (DEST's lock, ownership and room), `execute` (the copies or the exchange),
`finish` (the node's manifest, stale copies, the marker), `verify` (`mlhpc verify`).

Permissions: a staged file keeps its source's permission bits (less setuid, setgid, sticky),
a staged folder its source folder's (plus the owner's rwx, which a rerun needs), so a private
dataset stays private on a shared node-local disk; the node's manifest and marker, written for
others to read, follow the umask.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.fileio import current_umask
from mlhpc.staging import archive as archives
from mlhpc.staging.comm import CallbackComm, Communicator, LostRankError, agree
from mlhpc.staging.destination import agree_destination, lock_destination, refuse_overlap
from mlhpc.staging.execute import Settings, Work, stage_archive, stage_directory
from mlhpc.staging.finish import finish_node
from mlhpc.staging.iopath import IoPlan, choose_io, direct_writes_pay
from mlhpc.staging.journal import close_journal, read_journals
from mlhpc.staging.manifest import Manifest
from mlhpc.staging.plan import node_files
from mlhpc.staging.request import StageReport, StageRequest
from mlhpc.staging.sink import SinkOptions, Staged, forget_checked_dirs
from mlhpc.staging.source import describe_source, needed_bytes

log = logging.getLogger(__name__)


def stage_dataset(request: StageRequest, comm: Communicator | None = None) -> StageReport:
    """Stage the dataset at `request.src` (a directory or a tar/tar.gz/tar.zst archive) into
    `request.dest`.

    Without `comm`, one rank alone stages (a `CallbackComm` lets the ranks of one node split the
    work, synchronised by its barrier). With a collective `Communicator`, `request.mode` says what
    each node ends with (see `plan`). A rerun skips what is staged and verified already.
    `request.io` picks the I/O path (`vocabulary.IO_CHOICES`): "auto" decides on the node's memory and
    the source's cached share, "direct" reads large files with O_DIRECT and writes with it where
    that pays (`direct_writes_pay`), "buffered" and "kernel" never do.
    """
    comm = comm or CallbackComm()
    src, dest = request.src, request.dest
    started = time.perf_counter()
    refuse_overlap(src, dest)
    forget_checked_dirs()
    with ExitStack() as locked:  # DEST's lock, held until the marker is written
        lock_destination(comm, src, dest, locked)
        job = _plan_job(request, comm)
        work, evidence, error = _copy(comm, request, job)
        totals = agree(comm, error, work.read_bytes)
        held = finish_node(
            comm,
            src,
            dest,
            job.settings.mode,
            job.manifest if job.kind is None else None,
            work,
            job.settings.options,
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
    settings: Settings


def _plan_job(request: StageRequest, comm: Communicator) -> _Job:
    """The mode the nodes can have, the source's manifest, DEST agreed on by every rank (its
    room checked), and the I/O path for this node's share."""
    src, dest, mode, topo = request.src, request.dest, request.mode, comm.topology
    if mode == "replicate" and topo.num_nodes > 1 and not comm.collective:
        log.warning(
            "replicate over %d nodes needs a Communicator; every node copies the source", topo.num_nodes
        )
        mode = "copy"
    manifest, trusted = describe_source(comm, src)
    kind = archives.archive_kind(src) if src.is_file() else None
    mine = node_files(manifest, mode, topo) if kind is None else []
    needed = needed_bytes(src, kind, manifest, mine)
    fresh, token = agree_destination(comm, dest, needed)
    sources = [str(src)] if kind is not None else [os.path.join(src, f.path) for f in mine]
    io = choose_io(request.io, needed, sources, direct_writes_pay(str(dest)))
    log.debug("staging I/O: %s (%s)", io.label, io.reason)
    options = SinkOptions(
        manifest.algorithm, io.direct_writes, request.decompress, umask=current_umask(), run_token=token
    )
    settings = Settings(
        mode=mode,
        options=options,
        direct_reads=io.direct_reads,
        kernel_copy=io.kernel_copy,
        memory_bytes=io.available_bytes,
        source_cached=io.source_cached,
        workers=request.workers,
        processes=request.processes,
        chunk_bytes=request.chunk_bytes,
        progress=request.progress and comm.rank == 0,
    )
    return _Job(manifest=manifest, trusted=trusted, kind=kind, fresh=fresh, io=io, settings=settings)


def _copy(
    comm: Communicator, request: StageRequest, job: _Job
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
            work = stage_archive(comm, src, job.kind, dest, manifest, evidence or {}, job.settings)
        else:
            work = stage_directory(comm, src, dest, job.manifest, evidence, job.settings)
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
        mode=job.settings.mode,
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
