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

from mlhpc.common.errors import StagingError
from mlhpc.common.fileio import current_umask
from mlhpc.staging import archive as archives
from mlhpc.staging.comm import CallbackComm, Communicator, LostRankError, agree
from mlhpc.staging.destination import agree_destination, lock_destination, refuse_overlap
from mlhpc.staging.execute import Settings, Work, stage_archive, stage_directory
from mlhpc.staging.finish import finish_node
from mlhpc.staging.iopath import choose_io, direct_writes_pay
from mlhpc.staging.journal import close_journal, read_journals
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
    `request.io` picks the I/O path (`iopath.IO_CHOICES`): "auto" decides on the node's memory and
    the source's cached share, "direct" reads large files with O_DIRECT and writes with it where
    that pays (`direct_writes_pay`), "buffered" and "kernel" never do.
    """
    comm = comm or CallbackComm()
    src, dest, mode = request.src, request.dest, request.mode
    started = time.perf_counter()
    refuse_overlap(src, dest)
    forget_checked_dirs()
    with ExitStack() as locked:  # DEST's lock, held until the marker is written
        lock_destination(comm, src, dest, locked)
        topo = comm.topology
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
        plan = choose_io(request.io, needed, sources, direct_writes_pay(str(dest)))
        log.debug("staging I/O: %s (%s)", plan.label, plan.reason)
        options = SinkOptions(
            manifest.algorithm, plan.direct_writes, request.decompress, umask=current_umask(), run_token=token
        )
        settings = Settings(
            mode=mode,
            options=options,
            direct_reads=plan.direct_reads,
            kernel_copy=plan.kernel_copy,
            memory_bytes=plan.available_bytes,
            source_cached=plan.source_cached,
            workers=request.workers,
            processes=request.processes,
            chunk_bytes=request.chunk_bytes,
            progress=request.progress and comm.rank == 0,
        )
        error: str | None = None
        work = Work()
        evidence: dict[str, Staged] | None = None
        try:
            evidence = None if fresh else read_journals(dest)
            if kind is not None:
                work = stage_archive(
                    comm, src, kind, dest, manifest if trusted else None, evidence or {}, settings
                )
            else:
                work = stage_directory(comm, src, dest, manifest, evidence, settings)
        except LostRankError:
            raise
        except (StagingError, OSError) as e:
            error = str(e) if isinstance(e, StagingError) else f"cannot stage {src} to {dest}: {e}"
        finally:
            try:
                close_journal(str(dest))
            except StagingError as e:  # also when interrupted: the interruption goes on up, not this
                error = error or str(e)
        totals = agree(comm, error, work.read_bytes)
        held = finish_node(
            comm,
            src,
            dest,
            mode,
            manifest if kind is None else None,
            work,
            settings.options,
            request.durable,
            previous=evidence,
        )
        return StageReport(
            dest=dest,
            files=len(held.files),
            bytes=held.total_bytes,
            seconds=time.perf_counter() - started,
            mode=mode,
            copied_files=len(work.staged),
            skipped_files=work.skipped,
            read_bytes=work.read_bytes,
            job_read_bytes=sum(totals),
            node=topo.node,
            num_nodes=topo.num_nodes,
            io=plan,
            durable=request.durable,
            checked_by="checksums" if trusted else "identity",
            warnings=tuple(w for w in [archives.unchecked_warning(src, kind)] if w and not trusted and kind),
        )
