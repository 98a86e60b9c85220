"""A peer group's files as byte streams for the replicate exchange: each node reads its files in
order, chunk after chunk (`FileStreamReader`), and every node cuts each sender's stream back
into files, hashed, verified and renamed (`StreamSinks`, `FileStreamsConsumer`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from mlhpc.common.errors import StagingError
from mlhpc.staging.buffered import source_error
from mlhpc.staging.journal import journal
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.origin import open_regular
from mlhpc.staging.plan import Exchange, StreamItem
from mlhpc.staging.sink import BUFFER_BYTES, BufferPool, FileSink, SinkOptions, Staged, staged_path


class FileStreamReader:
    """This node's stream: its files, read in order, chunk after chunk."""

    def __init__(
        self, items: Sequence[StreamItem], src_root: str, dest_root: str, options: SinkOptions
    ) -> None:
        self.items = list(items)
        self.src_root = src_root
        self.dest_root = dest_root
        self.options = options
        self.read_bytes = 0
        """Bytes read from the source (not from node-local copies)."""
        self._index = 0
        self._fd = -1
        self._left = 0
        self._path = ""
        self._current = StreamItem(FileEntry("", 0, ""))

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
            if not self._current.from_dest:
                self.read_bytes += n
            if self._left == 0:
                os.close(self._fd)
                self._fd = -1
        return filled

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _open_next(self) -> bool:
        while self._index < len(self.items):
            item = self.items[self._index]
            self._index += 1
            if item.entry.size == 0:
                continue
            root, rel = (
                (self.dest_root, staged_path(item.entry.path, self.options))
                if item.from_dest
                else (self.src_root, item.entry.path)
            )
            self._path = os.path.join(root, rel)
            try:
                self._fd = open_regular(self._path)
                size = os.fstat(self._fd).st_size
            except OSError as e:
                raise source_error(e, self._path) from e
            if size != item.entry.size:
                raise StagingError(
                    f"staging source file {self._path} has {size} bytes, its listing says "
                    f"{item.entry.size}; the source changed: stage again"
                )
            self._current = item
            self._left = size
            return True
        return False


class StreamSinks:
    """One sender's stream on the receiving side: cut into files, each hashed, verified, renamed.

    A file that lies whole in one piece goes to `pool` (small files: many at a time); a file
    spread over pieces is written here, in order.
    """

    def __init__(
        self,
        items: Sequence[StreamItem],
        have: frozenset[str],
        dest_root: str,
        options: SinkOptions,
        pool: ThreadPoolExecutor,
        on_done: Callable[[list[Staged]], None],
    ) -> None:
        self.items = list(items)
        self.have = have
        self.dest_root = dest_root
        self.options = options
        self.pool = pool
        self.on_done = on_done
        self.buffers = BufferPool()
        self.staged: list[Staged] = []
        self.pending: list[Future[None]] = []
        self._index = 0
        self._offset = 0
        self._sink: FileSink | None = None

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
                    self._sink = FileSink(
                        self.dest_root, entry, self.options, self.buffers.get(min(BUFFER_BYTES, entry.size))
                    )
                if self._sink is not None:
                    self._sink.write(piece[:take])
                self._offset += take
                if self._offset == entry.size:
                    self._end_sink()
            else:
                return
            piece = piece[take:]

    def _write_whole(self, entry: FileEntry, data: memoryview) -> None:
        sink = FileSink(self.dest_root, entry, self.options, self.buffers.get(max(1, entry.size)))
        try:
            sink.write(data)
            self._record(sink.finish())
        finally:
            sink.abort()
            self.buffers.put(sink.buffer)

    def _end_sink(self) -> None:
        if self._sink is not None:
            sink, self._sink = self._sink, None
            try:
                self._record(sink.finish())
            finally:
                sink.abort()
                self.buffers.put(sink.buffer)
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
        if self._sink is not None:
            self._sink.abort()
            self._sink = None


class FileStreamsConsumer:
    """All senders' streams of a peer group on this node; small files written `workers` at a time."""

    def __init__(
        self,
        exchange: Exchange,
        have: frozenset[str],
        dest_root: str,
        options: SinkOptions,
        workers: int = 8,
        on_done: Callable[[list[Staged]], None] = lambda staged: None,
    ) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers))
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
