"""The executor: carry out one rank's part of a staging plan, for a directory or an archive,
with a progress bar (files, bytes and MB/s) on rank 0 at a terminal."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO

from mlhpc.common.errors import StagingError
from mlhpc.staging import archive as archives
from mlhpc.staging.archive import Pipe
from mlhpc.staging.comm import Communicator
from mlhpc.staging.engine import Staged, Work, make_folders, staged_path
from mlhpc.staging.exchange import (
    FileStreamReader,
    FileStreamsConsumer,
    chunk_size,
    exchange_rounds,
    peer_have_sets,
)
from mlhpc.staging.extract import ArchiveExtractor
from mlhpc.staging.journal import already_staged, journal
from mlhpc.staging.manifest import FileEntry, Manifest
from mlhpc.staging.parallel import run_copies
from mlhpc.staging.plan import plan_copies, plan_exchange, rank_files, read_first_order, uses_exchange
from mlhpc.staging.request import CopyOptions
from mlhpc.staging.source import Source, changed_while_copied, open_source, recorded_identity

ReadFirst = Callable[[], Sequence[Sequence[str]] | None]
"""Waits for, then gives, the files each node's training reads first, in order, relative to the
source (`stage_dataset`'s `read_first`); None: no order known."""


def stage_directory(
    comm: Communicator,
    src: Path,
    dest: Path,
    manifest: Manifest,
    evidence: dict[str, Staged] | None,
    options: CopyOptions,
    read_first: ReadFirst | None = None,
) -> Work:
    """Copy this rank's files from the source, or exchange them with the other nodes; in the
    order training reads them, when it runs meanwhile (`read_first`, see `stage_dataset`)."""
    topo = comm.topology
    files = rank_files(manifest, options.mode, topo)
    kept = [] if evidence is None else find_staged(src, dest, files, evidence, options)
    have = frozenset(s.source for s in kept)
    first = read_first() if read_first is not None else None
    if uses_exchange(options.mode, topo):
        if not topo.in_exchange:
            return Work()
        return _exchange_directory(comm, src, dest, files, have, options, first)
    if first:
        files = read_first_order(files, first[topo.node])
    ops = plan_copies(files, have)
    make_folders(str(dest), [staged_path(op.entry.path, options) for op in ops])
    entries = [op.entry for op in ops]
    with StageProgress(
        options.progress, len(ops), sum(f.size for f in entries), f"staging {src.name}"
    ) as progress:
        staged = run_copies(entries, str(src), str(dest), options, progress.advance)
    records = {s.source: s for s in [*kept, *staged]} if topo.local_size == 1 else None
    return Work(staged, skipped=len(have), read_bytes=sum(op.entry.size for op in ops), records=records)


def find_staged(
    src: Path, dest: Path, files: list[FileEntry], evidence: dict[str, Staged], options: CopyOptions
) -> list[Staged]:
    """The files a rerun may skip: staged before from a source file that has not changed since,
    and still verifying (each source stat'ed and each copy hashed, in parallel).

    Each is journaled again, so that the node's manifest lists it even when the evidence was
    only the source manifest (a copy made before journals, or by another tool)."""

    source = Source(src)

    def kept(entry: FileEntry) -> Staged | None:
        if entry.path not in evidence and not entry.checksum:
            return None  # nothing to go on: no stat of the source needed
        return already_staged(dest, entry, evidence, options, source.identity(entry.path))

    with ThreadPoolExecutor(max_workers=max(1, options.threads)) as pool:
        found = [s for s in pool.map(kept, files) if s]
    journal(str(dest), options.run_token).record_many(found)
    return found


def _exchange_directory(
    comm: Communicator,
    src: Path,
    dest: Path,
    files: list[FileEntry],
    have: frozenset[str],
    options: CopyOptions,
    first: Sequence[Sequence[str]] | None,
) -> Work:
    topo = comm.topology
    haves = peer_have_sets(comm, files, have, None)
    exchange = plan_exchange(files, haves, send_from_dest=not options.decompress, first=first)
    chunk = chunk_size(options.chunk_bytes, topo.num_nodes)
    lengths = [exchange.stream_bytes(n) for n in range(topo.num_nodes)]
    incoming = [i.entry for stream in exchange.streams for i in stream if i.entry.path not in have]
    reader = FileStreamReader(exchange.streams[topo.node], str(src), str(dest), options)
    with StageProgress(
        options.progress, len(incoming), sum(f.size for f in incoming), f"replicating {src.name}"
    ) as progress:
        consumer = FileStreamsConsumer(exchange, have, str(dest), options, progress.advance)
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
    options: CopyOptions,
) -> Work:
    """Local rank 0 of each node extracts the archive: read directly, or (replicate and shard
    over several nodes) striped over the nodes so that it is read once in total."""
    topo = comm.topology
    if topo.local_rank != 0:
        return Work()
    try:
        fd = open_source(src)
    except OSError as e:
        raise StagingError(
            f"cannot read staging source {src} ({e.strerror}); check it and its permissions"
        ) from e
    opened = os.fstat(fd)
    extractor = _extractor(comm, src, dest, manifest, evidence, options, origin=recorded_identity(opened))
    total = manifest.total_bytes if manifest is not None else archives.estimated_bytes(src, kind, None)
    with (
        StageProgress(
            options.progress, len(manifest.files) if manifest else 0, total, f"extracting {src.name}"
        ) as bar,
        open(fd, "rb", closefd=True) as handle,
    ):
        extractor.on_done = bar.advance
        if options.mode != "copy" and topo.num_nodes > 1 and comm.collective:
            read = _exchange_archive(comm, src, kind, extractor, options)
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
    options: CopyOptions,
    *,
    origin: str,
) -> ArchiveExtractor:
    """The extractor of this node's members: all of them, or in shard mode over several nodes
    the ones `archives.member_node` gives this node."""
    topo = comm.topology
    sharded = options.mode == "shard" and topo.num_nodes > 1
    return ArchiveExtractor(
        src,
        dest,
        options,
        manifest,
        evidence,
        keep=(lambda p: archives.member_node(p, topo.num_nodes) == topo.node)
        if sharded
        else (lambda p: True),
        workers=options.threads,
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
        self._fd = open_source(path)
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
    comm: Communicator, src: Path, kind: str, extractor: ArchiveExtractor, options: CopyOptions
) -> int:
    topo = comm.topology
    chunk = chunk_size(options.chunk_bytes, topo.num_nodes)
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


class StageProgress:
    """A rich progress bar over this rank's share; does nothing unless enabled at a terminal."""

    def __init__(self, enabled: bool, files: int, total_bytes: int, label: str) -> None:
        self._bar = None
        self._lock = threading.Lock()
        self._files = 0
        self._total_files = files
        if not (enabled and sys.stderr.isatty()):
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[files]}"),
            DownloadColumn(),
            TransferSpeedColumn(),
            transient=False,
        )
        self._task = self._bar.add_task(label, total=total_bytes, files=f"0/{files} files")

    def advance(self, staged: Sequence[Staged]) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._files += len(staged)
            self._bar.update(
                self._task,
                advance=sum(s.size for s in staged),
                files=f"{self._files}/{self._total_files} files",
            )

    def __enter__(self) -> StageProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
