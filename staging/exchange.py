"""The replicate exchange: each node reads its share once and all nodes get every byte.

Rounds of a fixed-size all-gather within a peer group: in each round every node contributes
the next chunk of its byte stream (prefetched by a reader thread) behind a small header that
carries an error, if it has one, so that every rank stops in the same round with the same
message. A writer thread hashes and writes the received chunks while the next round runs.

A peer group's files travel as byte streams: each node reads its files in order, chunk after
chunk (`FileStreamReader`, through the source seam), and every node cuts each sender's stream
back into files, each written by the engine (`engine.Partial`: hashed, verified, renamed;
`FileStreamsConsumer`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import Communicator, lost_peer, rank_label
from mlhpc.staging.engine import Partial, Staged, copy_once, staged_path
from mlhpc.staging.journal import journal
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.plan import Exchange, StreamItem
from mlhpc.staging.request import CopyOptions
from mlhpc.staging.source import Source

HEADER_BYTES = 4096
ROUND_BUDGET_BYTES = 256 << 20
"""Bytes one all-gather round moves into each rank at most: bounds memory at any node count."""
_MIN_CHUNK = 64 << 10


def chunk_size(chunk_bytes: int, peers: int) -> int:
    """A chunk per peer and round: `chunk_bytes`, smaller when many peers share the round budget."""
    per_peer = min(chunk_bytes, max(_MIN_CHUNK, ROUND_BUDGET_BYTES // max(1, peers)))
    return max(_MIN_CHUNK, per_peer // 4096 * 4096)


class BufferPool:
    """Reusable round buffers: fresh pages cost a page fault each, reused ones do not. Private
    anonymous memory, not `mmap`'s default shared mapping, whose pages are shmem's."""

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._lock = threading.Lock()

    def get(self, size: int) -> mmap.mmap:
        with self._lock:
            if free := self._free.get(size):
                return free.pop()
        return mmap.mmap(-1, max(1, size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def put(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.setdefault(len(buffer), []).append(buffer)


class Producer(Protocol):
    def fill(self, round_index: int, view: memoryview) -> int:
        """Write this node's chunk of the round into `view`; return its length."""
        ...


class Consumer(Protocol):
    def consume(self, pieces: list[memoryview]) -> None:
        """Take one round's chunks, one per node in node order."""
        ...


@dataclass
class _Prefetch:
    """Runs the producer ahead of the all-gathers in a thread, two rounds deep."""

    producer: Producer
    rounds: int
    chunk: int
    pool: BufferPool
    out: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=2))
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="mlhpc-stage-read", daemon=True).start()

    def _run(self) -> None:
        for r in range(self.rounds):
            buffer = self.pool.get(HEADER_BYTES + self.chunk)
            view = memoryview(buffer)
            error = None
            try:
                self.producer.fill(r, view[HEADER_BYTES : HEADER_BYTES + self.chunk])
            except StagingError as e:
                error = str(e)
            except Exception as e:  # any failure must reach the other ranks, or they wait forever
                error = f"cannot read the staging source: {e}"
            self.out.put((buffer, error))
            if error or self.stop.is_set():
                return


class _Writer:
    """Consumes rounds in order in a thread; remembers the first error and drops the rest."""

    def __init__(self, consumer: Consumer, pool: BufferPool) -> None:
        self.consumer = consumer
        self.pool = pool
        self.error: str | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="mlhpc-stage-write", daemon=True)
        self._thread.start()

    def submit(self, buffer: object, pieces: list[memoryview]) -> None:
        self._queue.put((buffer, pieces))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            buffer, pieces = item
            if self.error is None:
                try:
                    self.consumer.consume(pieces)
                except StagingError as e:
                    self.error = str(e)
                except Exception as e:  # the thread must go on taking rounds, or the main one blocks
                    self.error = f"cannot write a staged file: {e}"
            del pieces
            self.pool.put(buffer)  # type: ignore[arg-type]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def exchange_rounds(
    comm: Communicator,
    rounds: int,
    chunk: int,
    length: Callable[[int, int], int],
    producer: Producer,
    consumer: Consumer,
) -> str | None:
    """Run the rounds; `length(node, round)` is the size of that node's chunk, known to all.

    Every member of the peer group stops in the same round when any of them reports an error
    in its header; returns that error (naming its rank) or one this rank's writer found after
    the last round, for the caller's final agreement; None when all went well.
    """
    nodes = comm.topology.num_nodes
    pool = BufferPool()
    prefetch = _Prefetch(producer, rounds, chunk, pool)
    prefetch.start()
    writer = _Writer(consumer, pool)
    stride = HEADER_BYTES + chunk
    try:
        for r in range(rounds):
            send, error = prefetch.out.get()
            own = error or writer.error
            _write_header(send, f"{rank_label(comm)}: {own}" if own else None)
            received = pool.get(nodes * stride)
            try:
                comm.peer_allgather(memoryview(send)[:stride], memoryview(received)[: nodes * stride])
            except Exception as e:
                raise lost_peer(comm, f"staging exchange round {r + 1}/{rounds}", e) from e
            pool.put(send)
            view = memoryview(received)
            reported = [_read_header(view[n * stride : n * stride + HEADER_BYTES]) for n in range(nodes)]
            if any(reported):
                return next(message for message in reported if message)
            base = [n * stride + HEADER_BYTES for n in range(nodes)]
            writer.submit(received, [view[b : b + length(n, r)] for n, b in enumerate(base)])
            del view
    finally:
        prefetch.stop.set()
        with contextlib.suppress(queue.Empty):
            while True:  # unblock the reader thread if it waits to hand over a chunk
                prefetch.out.get_nowait()
        writer.close()
    return writer.error


def peer_have_sets(
    comm: Communicator, files: Sequence[FileEntry], have: frozenset[str], error: str | None
) -> list[frozenset[str]]:
    """Every peer's have-set over the peer group's `files` (the same list on every node), sent
    as a bitmap; raises a peer's error on every peer."""
    size = HEADER_BYTES + -(-len(files) // 8)
    send = bytearray(size)
    _write_header(send, f"{rank_label(comm)}: {error}" if error else None)
    for i, entry in enumerate(files):
        if entry.path in have:
            send[HEADER_BYTES + i // 8] |= 1 << (i % 8)
    nodes = comm.topology.num_nodes
    received = bytearray(size * nodes)
    try:
        comm.peer_allgather(memoryview(send), memoryview(received))
    except Exception as e:
        raise lost_peer(comm, "the staging have-set exchange", e) from e
    out = []
    for n in range(nodes):
        view = memoryview(received)[n * size : (n + 1) * size]
        if message := _read_header(view[:HEADER_BYTES]):
            raise StagingError(message)
        bits = view[HEADER_BYTES:]
        out.append(frozenset(f.path for i, f in enumerate(files) if bits[i // 8] >> (i % 8) & 1))
    return out


def _write_header(buffer: object, error: str | None) -> None:
    view = memoryview(buffer)  # type: ignore[arg-type]
    data = (error or "").encode()[: HEADER_BYTES - 4]
    view[:4] = len(data).to_bytes(4, "little")
    view[4 : 4 + len(data)] = data


def _read_header(view: memoryview) -> str:
    size = int.from_bytes(view[:4], "little")
    return bytes(view[4 : 4 + size]).decode(errors="replace")


AHEAD_FILES_PER_THREAD = 4
"""How far the copies ahead of an overlapped exchange's stream run: files per copying thread."""


class FileStreamReader:
    """This node's stream: its files, read in order, chunk after chunk (a file this node holds
    already is read from its verified copy, not from the source).

    While training reads the dataset (--staging overlap, `options.claims`), threads copy the
    stream's next files into the node-local copy ahead of it, each under its claim
    (`engine.copy_once`), and the stream is read from those copies: the source is read in
    parallel, in training's order, once per node, and training finds its files there."""

    def __init__(
        self, items: Sequence[StreamItem], src_root: str, dest_root: str, options: CopyOptions
    ) -> None:
        self.items = list(items)
        self.source, self.held = Source(src_root), Source(dest_root)
        self.options = options
        self.read_bytes = 0
        """Bytes read from the source (not from node-local copies)."""
        self._index = 0
        self._fd = -1
        self._left = 0
        self._path = ""
        self._from_dest = False
        self._ahead: dict[int, Future[bool]] = {}
        self._pool = ThreadPoolExecutor(max(1, options.threads), "mlhpc-ahead") if options.claims else None

    def fill(self, round_index: int, view: memoryview) -> int:
        filled = 0
        while filled < len(view):
            if self._fd < 0 and not self._open_next():
                break
            n = os.readv(self._fd, [view[filled : filled + min(self._left, len(view) - filled)]])
            if n == 0:
                raise StagingError(
                    f"staging source file {self._path} is shorter than its listing; stage again"
                )
            filled += n
            self._left -= n
            if not self._from_dest:
                self.read_bytes += n
            if self._left == 0:
                os.close(self._fd)
                self._fd = -1
        return filled

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _open_next(self) -> bool:
        while self._index < len(self.items):
            item = self.items[self._index]
            self._index += 1
            if item.entry.size == 0:
                continue
            held = item.from_dest or self._copied_ahead(self._index - 1)
            where = self.held if held else self.source
            rel = staged_path(item.entry.path, self.options) if held else item.entry.path
            self._path = where.path(rel)
            self._fd = where.open(rel)
            size = os.fstat(self._fd).st_size
            if size != item.entry.size:
                raise StagingError(
                    f"staging source file {self._path} has {size} bytes, its listing says "
                    f"{item.entry.size}; the source changed: stage again"
                )
            self._from_dest = held
            self._left = size
            return True
        return False

    def _copied_ahead(self, index: int) -> bool:
        """Whether item `index` is in the node-local copy now (copied ahead, or by training)."""
        if self._pool is None:
            return False
        window = AHEAD_FILES_PER_THREAD * max(1, self.options.threads)
        for later in range(index, min(len(self.items), index + window)):
            if later not in self._ahead and not self.items[later].from_dest:
                self._ahead[later] = self._pool.submit(self._copy, self.items[later].entry)
        future = self._ahead.pop(index, None)
        if future is None:
            return False
        if future.result():  # its error (a file that fails its checksum) is staging's
            self.read_bytes += self.items[index].entry.size
        return True

    def _copy(self, entry: FileEntry) -> bool:
        """Copy `entry` into the node-local copy unless it is there; True if this read the source."""
        return copy_once(str(self.source.root), str(self.held.root), entry, self.options, "staging")[1]


class StreamSinks:
    """One sender's stream on the receiving side, cut into files. A file that lies whole in one
    piece goes to `pool` (small files: many at a time); one spread over pieces is written here."""

    def __init__(
        self,
        items: Sequence[StreamItem],
        have: frozenset[str],
        dest_root: str,
        options: CopyOptions,
        pool: ThreadPoolExecutor,
        on_done: Callable[[list[Staged]], None],
    ) -> None:
        self.items = list(items)
        self.have = have
        self.dest_root = dest_root
        self.options = options
        self.pool = pool
        self.on_done = on_done
        self.staged: list[Staged] = []
        self.pending: list[Future[None]] = []
        self._index = 0
        self._offset = 0
        self._partial: Partial | None = None

    def feed(self, piece: memoryview) -> None:
        while self._index < len(self.items):
            entry = self.items[self._index].entry
            take = min(len(piece), entry.size - self._offset)
            if self._offset == 0 and take == entry.size:  # the whole file is in this piece
                if entry.path not in self.have:
                    self.pending.append(self.pool.submit(self._write_whole, entry, piece[:take]))
                self._next()
            elif take:
                if self._offset == 0 and entry.path not in self.have:
                    self._partial = Partial(self.dest_root, entry, self.options)
                if self._partial is not None:
                    self._partial.write(piece[:take])
                self._offset += take
                if self._offset == entry.size:
                    self._end_partial()
            else:
                return
            piece = piece[take:]

    def _write_whole(self, entry: FileEntry, data: memoryview) -> None:
        with Partial(self.dest_root, entry, self.options) as partial:
            partial.write(data)
            self._record(partial.finish())

    def _end_partial(self) -> None:
        if self._partial is not None:
            partial, self._partial = self._partial, None
            with partial:
                self._record(partial.finish())
        self._next()

    def _next(self) -> None:
        self._index += 1
        self._offset = 0

    def _record(self, staged: Staged) -> None:
        journal(self.dest_root, self.options.run_token).record(staged)
        self.staged.append(staged)
        self.on_done([staged])

    def check_complete(self) -> None:
        if self._index < len(self.items):
            raise StagingError(
                f"staging exchange ended before {self.items[self._index].entry.path} was complete"
            )

    def abort(self) -> None:
        if self._partial is not None:
            self._partial.abort()
            self._partial = None


class FileStreamsConsumer:
    """All senders' streams of a peer group on this node; small files written `threads` at a time."""

    def __init__(
        self,
        exchange: Exchange,
        have: frozenset[str],
        dest_root: str,
        options: CopyOptions,
        on_done: Callable[[list[Staged]], None] = lambda staged: None,
    ) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max(1, options.threads))
        self.streams = [
            StreamSinks(items, have, dest_root, options, self.pool, on_done) for items in exchange.streams
        ]

    def consume(self, pieces: list[memoryview]) -> None:
        """Write one round; returns when all of it is written (the round's buffer is reused)."""
        try:
            for stream, piece in zip(self.streams, pieces, strict=True):
                stream.feed(piece)
        finally:
            pending = [f for stream in self.streams for f in stream.pending]
            for stream in self.streams:
                stream.pending = []
            wait(pending)
        for future in pending:
            future.result()

    def close(self) -> list[Staged]:
        self.consume([memoryview(b"")] * len(self.streams))  # files of 0 bytes at the ends
        for stream in self.streams:
            stream.check_complete()
        return [staged for stream in self.streams for staged in stream.staged]

    def abort(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for stream in self.streams:
            stream.abort()
