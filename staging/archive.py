"""Archive sources (tar, tar.gz, tar.zst): members checked for safety and extracted while staging.

An archive is one stream, so one rank per node extracts it. Its manifest is a sidecar file
`<archive>.mlhpc_manifest.json` or a member `mlhpc_manifest.json` at the archive's root;
without one, checksums are computed from the extracted bytes.
"""

from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import queue
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.staging.copy import already_staged, journal
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest
from mlhpc.staging.sink import BUFFER_BYTES, BufferPool, FileSink, SinkOptions, Staged

log = logging.getLogger(__name__)
ARCHIVE_KINDS = {".tar": "tar", ".tar.gz": "gz", ".tgz": "gz", ".tar.zst": "zst", ".tzst": "zst"}
_POOLED_MEMBER_BYTES = 16 << 20  # smaller members are written by the thread pool
_IN_FLIGHT_BYTES = 256 << 20


def archive_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, kind in sorted(ARCHIVE_KINDS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return kind
    return None


def sidecar_manifest(path: Path) -> Path:
    return path.with_name(f"{path.name}.{MANIFEST_NAME}")


def estimated_bytes(path: Path, kind: str, manifest: Manifest | None) -> int:
    """Extracted size for the free-space check: the manifest's, else the best the format tells."""
    if manifest is not None:
        return manifest.total_bytes
    size = path.stat().st_size
    if kind == "zst":
        import zstandard

        with open(path, "rb") as handle:
            content = zstandard.frame_content_size(handle.read(18))
        if content > 0:
            return content
    return size  # a lower bound for a compressed archive; a full disk is still caught while writing


def tar_stream(raw: IO[bytes], kind: str) -> tarfile.TarFile:
    """A streaming TarFile over the raw archive bytes (no seeking: it also reads from a pipe)."""
    if kind == "zst":
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20, read_across_frames=True)
        return tarfile.open(fileobj=raw, mode="r|", bufsize=1 << 20)
    return tarfile.open(fileobj=raw, mode="r|gz" if kind == "gz" else "r|", bufsize=1 << 20)


def safe_name(member: tarfile.TarInfo, archive: Path) -> str | None:
    """The member's path inside DEST, or None for the root; refuses anything that leaves DEST."""
    name = member.name.replace("\\", "/")
    where = f"{archive}: member {member.name!r}"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise StagingError(f"{where} has an absolute path; refused: rebuild the archive with relative paths")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StagingError(f"{where} climbs out with '..'; refused: rebuild the archive without it")
    if member.issym() or member.islnk():
        target = member.linkname.replace("\\", "/")
        base = posixpath.dirname("/".join(parts)) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise StagingError(
                f"{where} links to {member.linkname!r}, outside DEST; refused: rebuild the archive without it"
            )
    elif not (member.isfile() or member.isdir()):
        raise StagingError(f"{where} is a device or FIFO; refused: rebuild the archive without it")
    return "/".join(parts) or None


def _stream_errors(kind: str) -> tuple[type[Exception], ...]:
    errors: tuple[type[Exception], ...] = (tarfile.TarError, EOFError, zlib.error, ValueError)
    if kind == "zst":
        import zstandard

        errors += (zstandard.ZstdError,)
    return errors


def member_node(path: str, num_nodes: int) -> int:
    """The node that holds archive member `path` in shard mode (by a hash of its path: an
    archive is streamed, so its members cannot be balanced by size before they are seen)."""
    return xxhash.xxh3_64_intdigest(path.encode()) % num_nodes


class ArchiveExtractor:
    """Extract one archive stream into `dest`: every member verified, written under a temporary
    name and renamed; `keep(path)` picks the regular files this node holds."""

    def __init__(
        self,
        archive: Path,
        dest: Path,
        options: SinkOptions,
        manifest: Manifest | None,
        evidence: dict[str, Staged],
        keep: Callable[[str], bool] = lambda path: True,
        workers: int = 8,
        on_done: Callable[[list[Staged]], None] = lambda staged: None,
    ) -> None:
        self.archive = archive
        self.dest = dest
        self.options = options
        self.expected = {f.path: f for f in manifest.files} if manifest else None
        self.evidence = evidence
        self.keep = keep
        self.on_done = on_done
        self.staged: dict[str, Staged] = {}
        """Every member this node holds, by path (written now or verified from an earlier run)."""
        self.written: list[Staged] = []
        self.skipped = 0
        self._links: list[tarfile.TarInfo] = []
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers))
        self._futures: list[Future[Staged]] = []
        self._budget = threading.BoundedSemaphore(_IN_FLIGHT_BYTES >> 20)
        self._buffers = BufferPool()
        self._lock = threading.Lock()

    def run(self, raw: IO[bytes], kind: str) -> list[Staged]:
        """Extract everything; on any error, wait for the writers and raise it."""
        try:
            with tar_stream(raw, kind) as tar:
                for member in tar:
                    name = safe_name(member, self.archive)
                    if name is None or member.isdir() or posixpath.basename(name).startswith(".mlhpc"):
                        continue
                    member.name = name
                    if name == MANIFEST_NAME:
                        self._take_manifest(tar.extractfile(member))
                    elif member.issym() or member.islnk():
                        self._links.append(member)
                    elif self.keep(name):
                        self._member(tar, member)
            self._drain()
        except _stream_errors(kind) as e:
            self._pool.shutdown(wait=True, cancel_futures=True)
            raise StagingError(
                f"{self.archive} is not a readable {kind} archive ({e}); check or rebuild it"
            ) from e
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._check_complete()
        for member in self._links:
            self._link(member)
        return list(self.staged.values())

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        entry = self._entry(member.name, member.size)
        if (kept := already_staged(self.dest, entry, self.evidence, self.options)) is not None:
            self.skipped += 1
            self.staged[entry.path] = kept
            return
        handle = tar.extractfile(member)
        assert handle is not None
        if member.size <= _POOLED_MEMBER_BYTES:  # small: read here, hash and write in the pool
            data = handle.read()
            megabytes = max(1, len(data) >> 20)
            for _ in range(megabytes):
                self._budget.acquire()
            self._futures.append(self._pool.submit(self._write, entry, [data], megabytes))
            if len(self._futures) > 4096:
                self._drain(done_only=True)
            return
        self._write(entry, iter(lambda: handle.read(BUFFER_BYTES), b""), 0)

    def _write(self, entry: FileEntry, pieces: Iterable[bytes], megabytes: int) -> Staged:
        sink = FileSink(str(self.dest), entry, self.options, self._buffers.get(min(BUFFER_BYTES, entry.size)))
        try:
            for piece in pieces:
                sink.write(piece)
            staged = sink.finish()
        finally:
            sink.abort()
            self._buffers.put(sink.buffer)
            for _ in range(megabytes):
                self._budget.release()
        journal(str(self.dest)).record(staged)
        with self._lock:
            self.staged[staged.source] = staged
            self.written.append(staged)
        self.on_done([staged])
        return staged

    def _entry(self, name: str, size: int) -> FileEntry:
        with self._lock:
            known = self.expected.get(name) if self.expected is not None else None
            listed = self.expected is not None
        if listed and known is None:
            raise StagingError(
                f"{self.archive}: member {name} is not in its {MANIFEST_NAME}; rebuild the manifest"
            )
        if known is not None and known.size != size:
            raise StagingError(
                f"{self.archive}: member {name} has {size} bytes, its manifest says {known.size}; rebuild the manifest"
            )
        return known or FileEntry(name, size, "")

    def _take_manifest(self, handle: IO[bytes] | None) -> None:
        """A manifest member: check the members before it now, and those after it as they come."""
        assert handle is not None
        try:
            manifest = Manifest.from_json(json.loads(handle.read()), self.archive)
        except ValueError as e:
            raise StagingError(
                f"{self.archive}: its {MANIFEST_NAME} member is not JSON ({e}); rebuild it"
            ) from e
        self._drain()
        with self._lock:
            if self.expected is None:  # a sidecar manifest wins
                self.expected = {f.path: f for f in manifest.files}
        for staged in list(self.staged.values()):
            known = self.expected.get(staged.source)
            if known is None or (known.checksum, known.size) != (staged.checksum, staged.size):
                (self.dest / staged.path).unlink(missing_ok=True)
                raise StagingError(
                    f"{self.archive}: member {staged.source} fails its {self.options.algorithm} check "
                    f"against the archive's {MANIFEST_NAME}; rebuild the archive"
                )

    def _drain(self, done_only: bool = False) -> None:
        """Collect finished writes (all of them unless `done_only`), raising the first error."""
        keep: list[Future[Staged]] = []
        for future in self._futures:
            if done_only and not future.done():
                keep.append(future)
            else:
                future.result()
        self._futures = keep

    def _check_complete(self) -> None:
        if self.expected is None:
            return
        missing = sorted(p for p in self.expected if self.keep(p) and p not in self.staged)
        if missing:
            raise StagingError(
                f"{self.archive} lacks {missing[0]} (and {len(missing) - 1} more) listed in its manifest; "
                "rebuild the archive"
            )

    def _link(self, member: tarfile.TarInfo) -> None:
        target = self.dest / member.name
        if member.issym():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            os.symlink(member.linkname, target)
            return
        source = posixpath.normpath(member.linkname.replace("\\", "/"))
        if source not in self.staged:
            log.warning(
                "%s: hard link %s -> %s: target not on this node; skipped", self.archive, member.name, source
            )
            return
        linked = self.staged[source]
        target.unlink(missing_ok=True)
        os.link(self.dest / linked.path, target)
        self.staged[member.name] = Staged(
            member.name, linked.size, linked.checksum, member.name, linked.checksum
        )


class Pipe(io.RawIOBase):
    """Bytes pushed by one thread (the exchange) and read as a file by another (the extractor)."""

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._left = memoryview(b"")
        self._eof = False

    def readable(self) -> bool:
        return True

    def push(self, data: bytes | None, stopped: threading.Event) -> bool:
        """Hand over `data` (None: the end); False when the reader has stopped reading."""
        while not stopped.is_set():
            try:
                self._queue.put(data, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def readinto(self, target: Any) -> int:
        while not self._left and not self._eof:
            item = self._queue.get()
            if item is None:
                self._eof = True
            else:
                self._left = memoryview(item)
        n = min(len(target), len(self._left))
        target[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def build_archive_manifest(path: Path, algorithm: str = "xxh3_128") -> Manifest:
    """Hash every regular member of an archive (for `mlhpc stage --make-manifest ARCHIVE`)."""
    from mlhpc.staging.manifest import new_hasher

    kind = archive_kind(path)
    if kind is None:
        raise StagingError(f"{path} is not a .tar, .tar.gz or .tar.zst archive")
    entries = []
    with open(path, "rb") as raw, tar_stream(raw, kind) as tar:
        for member in tar:
            name = safe_name(member, path)
            if name is None or not member.isfile() or name == MANIFEST_NAME:
                continue
            hasher = new_hasher(algorithm)
            handle = tar.extractfile(member)
            assert handle is not None
            while data := handle.read(BUFFER_BYTES):
                hasher.update(data)
            entries.append(FileEntry(name, member.size, hasher.hexdigest()))
    return Manifest(algorithm, tuple(sorted(entries, key=lambda f: f.path)))
