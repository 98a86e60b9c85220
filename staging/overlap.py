"""Staging while training runs (`--staging overlap`): the same staging, in a thread from
run_start, and the loaders reading the source's files through the copy it makes.

A file training asks for before staging reached it is copied there and then by the engine,
under the file's claim (`engine.copy_once`), and verified as any staged file is; staging finds
it done and records it. So a node reads each file from the source once, and every later read is
of the node-local copy. The copy is planned, verified, journaled and marked complete exactly
as a synchronous staging's: `stage_dataset` itself runs in the thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import Communicator
from mlhpc.staging.engine import copy_once, demand_copies, request_stop
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.request import CopyOptions, StageReport, StageRequest
from mlhpc.staging.stage import describe_source, stage_dataset

STOP_WAIT_S = 30.0
"""How long a stopped staging gets to end its copies (each stops at its next 1 MiB slice)."""


@dataclass(frozen=True)
class NodeCopy:
    """The node-local copy being made, as the loaders read it (`safeio.datasets.ReadThrough`):
    a file of the source is read from DEST, copied there first if staging has not yet."""

    src_root: str
    dest_root: str
    entries: Mapping[str, FileEntry]
    options: CopyOptions

    def local_path(self, path: str) -> str | None:
        prefix = self.src_root + os.sep
        if not path.startswith(prefix):
            return None
        entry = self.entries.get(path[len(prefix) :])
        if entry is None:  # not a file staging copies: read where it is
            return None
        local = os.path.join(self.dest_root, entry.path)
        if not os.path.isfile(local):  # a staged file gets its name only once verified
            # its own temporary name: an exchange may be writing the same file meanwhile
            options = replace(self.options, run_token=f"d{os.getpid()}.{self.options.run_token}")
            copy_once(self.src_root, self.dest_root, entry, options, "demand")
        return local


class OverlappedStaging:
    """`stage_dataset` in a thread. Every rank constructs it at the same point: the source is
    described here, collectively, before the thread starts."""

    def __init__(
        self, request: StageRequest, comm: Communicator, done: Callable[[StageReport], None] | None = None
    ) -> None:
        if request.claims is None:
            raise ValueError("an overlapped staging needs request.claims, a folder beside DEST")
        if not request.src.is_dir():
            raise StagingError(
                f"--staging overlap reads the dataset's files while it stages them, and {request.src} "
                "is not a directory; stage an archive with --staging inside (or before)"
            )
        if request.decompress:
            raise StagingError("--staging overlap reads files as they are; drop --decompress")
        self.request, self.comm, self._done = request, comm, done
        self.described = describe_source(comm, request.src)
        request.claims.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.report: StageReport | None = None
        self.error: BaseException | None = None
        self._options: CopyOptions | None = None
        self._planned = threading.Event()
        self._order: list[list[str]] | None = None
        self._ordered = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlhpc-staging", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            report = stage_dataset(
                self.request,
                self.comm,
                described=self.described,
                planned=self._plan,
                read_first=self._read_first,
            )
            if self._done is not None:
                self._done(report)  # at the moment the copy is complete (staging_stop's time)
            self.report = report
        except BaseException as e:  # the training thread raises it (`wait`, `check`)
            self.error = e
        finally:
            self.ended = time.perf_counter()
            self._planned.set()

    def _plan(self, options: CopyOptions) -> None:
        self._options = options
        self._planned.set()

    def read_order(self, paths: list[list[str]] | None) -> None:
        """The files each node's training reads first, in order (source paths as the loaders
        name them); None: not known. Staging waits for it before its first copy (every rank
        gives the same, worked out from the seed, so the nodes plan alike)."""
        prefix = str(self.request.src) + os.sep
        known = {entry.path for entry in self.described[0].files}
        if paths is not None:
            rels = ([p[len(prefix) :] for p in node if p.startswith(prefix)] for node in paths)
            self._order = [[rel for rel in node if rel in known] for node in rels]
        self._ordered.set()

    def _read_first(self) -> list[list[str]] | None:
        self._ordered.wait()
        return self._order

    def node_copy(self) -> NodeCopy:
        """What the loaders read through, once DEST is locked and agreed (before any copy)."""
        self._planned.wait()
        if self._options is None:
            self.wait()  # staging failed before it copied: its error
            raise StagingError(f"staging into {self.request.dest} ended before it planned its copies")
        entries = {entry.path: entry for entry in self.described[0].files}
        return NodeCopy(str(self.request.src), str(self.request.dest), entries, self._options)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def failed(self) -> bool:
        return not self.running and self.error is not None

    def wait(self) -> StageReport:
        """Wait for the staging to end: its report, or its error raised here."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.report is not None
        return self.report

    def stop(self) -> None:
        """Stop the copies under way (training failed or was interrupted) and wait a little for
        the thread; a thread waiting on another node stays behind (a daemon: it ends with us)."""
        request_stop(str(self.request.dest))
        self._ordered.set()  # a staging waiting for the order goes on, to stop
        self._thread.join(STOP_WAIT_S)

    def seconds(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    def demand_copies(self) -> int:
        """Files of this node that training copied before staging reached them."""
        return demand_copies(str(self.request.claims))
