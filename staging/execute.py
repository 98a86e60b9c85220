"""The executor: carry out one rank's part of a staging plan, for a directory or an archive."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from mlhpc.common.errors import StagingError
from mlhpc.staging import archive as archives
from mlhpc.staging.archive_stream import Pipe
from mlhpc.staging.buffered import make_folders
from mlhpc.staging.comm import Communicator
from mlhpc.staging.copy import CopyJob
from mlhpc.staging.exchange import chunk_size, exchange_rounds, peer_have_sets
from mlhpc.staging.extract import ArchiveExtractor
from mlhpc.staging.file_streams import FileStreamReader, FileStreamsConsumer
from mlhpc.staging.journal import already_staged, journal
from mlhpc.staging.manifest import FileEntry, Manifest
from mlhpc.staging.origin import changed_while_copied, current_identity, open_regular, recorded_identity
from mlhpc.staging.parallel import run_copies, shape
from mlhpc.staging.plan import Mode, plan_copies, plan_exchange, rank_files, uses_exchange
from mlhpc.staging.progress import StageProgress
from mlhpc.staging.sink import SinkOptions, Staged, staged_path


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How one rank stages (the knobs of `stage_dataset`)."""

    mode: Mode
    options: SinkOptions
    direct_reads: bool
    kernel_copy: bool = False
    """Large files copied in the kernel (`--io kernel`)."""
    memory_bytes: int | None = None
    """The memory this node may use (None: unknown): the direct path's buffers fit in it."""
    source_cached: bool = False
    """The source is in the page cache: copies wait on the CPU, not the disk, so threads
    beyond the CPUs only queue for them."""
    workers: int
    processes: int | None
    chunk_bytes: int
    progress: bool


@dataclass
class Work:
    """What one rank did."""

    staged: list[Staged] = field(default_factory=list)
    """Files this rank wrote."""
    skipped: int = 0
    """Files this rank found staged and verified already."""
    read_bytes: int = 0
    """Bytes this rank read from the source."""
    held: list[Staged] | None = None
    """Everything the node holds, when this rank alone knows it (an archive's extractor)."""
    records: dict[str, Staged] | None = None
    """Every file of the node by source path, when this rank alone staged them (one rank a
    node, copying): the node's manifest is made from these, not read back from the journals."""


def stage_directory(
    comm: Communicator,
    src: Path,
    dest: Path,
    manifest: Manifest,
    evidence: dict[str, Staged] | None,
    settings: Settings,
) -> Work:
    """Copy this rank's files from the source, or exchange them with the other nodes."""
    topo = comm.topology
    files = rank_files(manifest, settings.mode, topo)
    kept = [] if evidence is None else find_staged(src, dest, files, evidence, settings)
    have = frozenset(s.source for s in kept)
    if uses_exchange(settings.mode, topo):
        return _exchange_directory(comm, src, dest, files, have, settings) if topo.in_exchange else Work()
    ops = plan_copies(files, have)
    job, processes = shape(
        CopyJob(
            str(src),
            str(dest),
            settings.options,
            threads=settings.workers,
            direct_reads=settings.direct_reads,
            kernel_copy=settings.kernel_copy,
        ),
        [op.entry.size for op in ops],
        workers=settings.workers,
        processes=settings.processes,
        local_size=topo.local_size,
        source_cached=settings.source_cached,
        memory_bytes=settings.memory_bytes,
    )
    make_folders(str(dest), [staged_path(op.entry.path, settings.options) for op in ops])
    with StageProgress(
        settings.progress, len(ops), sum(op.entry.size for op in ops), f"staging {src.name}"
    ) as progress:
        staged = run_copies(ops, job, processes, progress.advance)
    records = {s.source: s for s in [*kept, *staged]} if topo.local_size == 1 else None
    return Work(staged, skipped=len(have), read_bytes=sum(op.entry.size for op in ops), records=records)


def find_staged(
    src: Path, dest: Path, files: list[FileEntry], evidence: dict[str, Staged], settings: Settings
) -> list[Staged]:
    """The files a rerun may skip: staged before from a source file that has not changed since,
    and still verifying (each source stat'ed and each copy hashed, in parallel).

    Each is journaled again, so that the node's manifest lists it even when the evidence was
    only the source manifest (a copy made before journals, or by another tool)."""

    def kept(entry: FileEntry) -> Staged | None:
        if entry.path not in evidence and not entry.checksum:
            return None  # nothing to go on: no stat of the source needed
        return already_staged(dest, entry, evidence, settings.options, current_identity(src / entry.path))

    with ThreadPoolExecutor(max_workers=max(1, settings.workers)) as pool:
        found = [s for s in pool.map(kept, files) if s]
    journal(str(dest), settings.options.run_token).record_many(found)
    return found


def _exchange_directory(
    comm: Communicator,
    src: Path,
    dest: Path,
    files: list[FileEntry],
    have: frozenset[str],
    settings: Settings,
) -> Work:
    topo = comm.topology
    haves = peer_have_sets(comm, files, have, None)
    exchange = plan_exchange(files, haves, send_from_dest=not settings.options.decompress)
    chunk = chunk_size(settings.chunk_bytes, topo.num_nodes)
    lengths = [exchange.stream_bytes(n) for n in range(topo.num_nodes)]
    incoming = [i.entry for stream in exchange.streams for i in stream if i.entry.path not in have]
    reader = FileStreamReader(exchange.streams[topo.node], str(src), str(dest), settings.options)
    with StageProgress(
        settings.progress, len(incoming), sum(f.size for f in incoming), f"replicating {src.name}"
    ) as progress:
        consumer = FileStreamsConsumer(
            exchange, have, str(dest), settings.options, settings.workers, progress.advance
        )
        try:
            error = exchange_rounds(
                comm,
                exchange.rounds(chunk),
                chunk,
                lambda n, r: max(0, min(chunk, lengths[n] - r * chunk)),
                reader,
                consumer,
            )
            staged = consumer.close() if error is None else []
        finally:
            consumer.abort()
            reader.close()
    if error:
        raise StagingError(error)
    return Work(staged, skipped=len(have), read_bytes=reader.read_bytes)


def stage_archive(
    comm: Communicator,
    src: Path,
    kind: str,
    dest: Path,
    manifest: Manifest | None,
    evidence: dict[str, Staged],
    settings: Settings,
) -> Work:
    """Local rank 0 of each node extracts the archive: read directly, or (replicate and shard
    over several nodes) striped over the nodes so that it is read once in total."""
    topo = comm.topology
    if topo.local_rank != 0:
        return Work()
    try:
        fd = open_regular(src)
    except OSError as e:
        raise StagingError(
            f"cannot read staging source {src} ({e.strerror}); check it and its permissions"
        ) from e
    opened = os.fstat(fd)
    extractor = _extractor(comm, src, dest, manifest, evidence, settings, origin=recorded_identity(opened))
    total = manifest.total_bytes if manifest is not None else archives.estimated_bytes(src, kind, None)
    with (
        StageProgress(
            settings.progress, len(manifest.files) if manifest else 0, total, f"extracting {src.name}"
        ) as bar,
        open(fd, "rb", closefd=True) as handle,
    ):
        extractor.on_done = bar.advance
        if settings.mode != "copy" and topo.num_nodes > 1 and comm.collective:
            read = _exchange_archive(comm, src, kind, extractor, settings)
        else:
            counting = _Counting(handle)
            extractor.run(counting, kind)
            read = counting.count
        if (moved := changed_while_copied(str(src), opened, fd)) is not None:
            raise moved  # what was extracted may mix two archives: nothing is marked staged
    return Work(extractor.written, extractor.skipped, read, held=list(extractor.staged.values()))


def _extractor(
    comm: Communicator,
    src: Path,
    dest: Path,
    manifest: Manifest | None,
    evidence: dict[str, Staged],
    settings: Settings,
    *,
    origin: str,
) -> ArchiveExtractor:
    """The extractor of this node's members: all of them, or in shard mode over several nodes
    the ones `archives.member_node` gives this node."""
    topo = comm.topology
    sharded = settings.mode == "shard" and topo.num_nodes > 1
    return ArchiveExtractor(
        src,
        dest,
        settings.options,
        manifest,
        evidence,
        keep=(lambda p: archives.member_node(p, topo.num_nodes) == topo.node)
        if sharded
        else (lambda p: True),
        workers=settings.workers,
        origin=origin,
    )


class _Counting:
    """A file wrapper that counts the bytes read through it."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.count += len(data)
        return data


class _Stripes:
    """This node's stripes of the archive: chunk k of it is read by node k mod N."""

    def __init__(self, path: Path, node: int, nodes: int, chunk: int) -> None:
        self._fd = open_regular(path)
        self.size = os.fstat(self._fd).st_size
        self.node, self.nodes, self.chunk = node, nodes, chunk
        self.read_bytes = 0

    def length(self, node: int, round_index: int) -> int:
        start = (round_index * self.nodes + node) * self.chunk
        return max(0, min(self.chunk, self.size - start))

    def fill(self, round_index: int, view: memoryview) -> int:
        want = self.length(self.node, round_index)
        offset = (round_index * self.nodes + self.node) * self.chunk
        got = 0
        while got < want:
            n = os.preadv(self._fd, [view[got:want]], offset + got)
            if n == 0:
                raise StagingError("the archive is shorter than when staging began; stage again")
            got += n
        self.read_bytes += got
        return got

    def close(self) -> None:
        os.close(self._fd)


class _PipeFeed:
    """Consumer of the exchange: hands the rounds, in order, to the extractor thread."""

    def __init__(self, pipe: Pipe, stopped: threading.Event, outcome: list[BaseException]) -> None:
        self.pipe = pipe
        self.stopped = stopped
        self.outcome = outcome

    def consume(self, pieces: list[memoryview]) -> None:
        for piece in pieces:
            if piece and not self.pipe.push(bytes(piece), self.stopped):
                if self.outcome:  # the extractor failed: every rank gets its message
                    raise StagingError(str(self.outcome[0]))
                return  # the extractor met the end-of-archive blocks: the rest is padding


def _exchange_archive(
    comm: Communicator, src: Path, kind: str, extractor: ArchiveExtractor, settings: Settings
) -> int:
    topo = comm.topology
    chunk = chunk_size(settings.chunk_bytes, topo.num_nodes)
    stripes = _Stripes(src, topo.node, topo.num_nodes, chunk)
    pipe = Pipe()
    stopped = threading.Event()
    outcome: list[BaseException] = []

    def extract() -> None:
        try:
            extractor.run(pipe, kind)  # type: ignore[arg-type]
        except BaseException as e:
            outcome.append(e)
        finally:
            stopped.set()

    thread = threading.Thread(target=extract, name="mlhpc-stage-extract", daemon=True)
    thread.start()
    rounds = -(-stripes.size // (chunk * topo.num_nodes))
    try:
        feed = _PipeFeed(pipe, stopped, outcome)
        error = exchange_rounds(comm, rounds, chunk, stripes.length, stripes, feed)
    finally:
        pipe.push(None, stopped)
        thread.join()
        stripes.close()
    if error:
        raise StagingError(error)
    if outcome:
        raise outcome[0]
    return stripes.read_bytes
