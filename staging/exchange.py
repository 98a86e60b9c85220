"""The replicate exchange: each node reads its share once and all nodes get every byte
(the byte streams that carry its files are in file_streams.py).

Rounds of a fixed-size all-gather within a peer group: in each round every node contributes
the next chunk of its byte stream (prefetched by a reader thread) behind a small header that
carries an error, if it has one, so that every rank stops in the same round with the same
message. A writer thread hashes and writes the received chunks while the next round runs.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import Communicator, lost_peer, rank_label
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.sink import BufferPool

HEADER_BYTES = 4096
ROUND_BUDGET_BYTES = 256 << 20
"""Bytes one all-gather round moves into each rank at most: bounds memory at any node count."""
_MIN_CHUNK = 64 << 10


def chunk_size(chunk_bytes: int, peers: int) -> int:
    """A chunk per peer and round: `chunk_bytes`, smaller when many peers share the round budget."""
    per_peer = min(chunk_bytes, max(_MIN_CHUNK, ROUND_BUDGET_BYTES // max(1, peers)))
    return max(_MIN_CHUNK, per_peer // 4096 * 4096)


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
