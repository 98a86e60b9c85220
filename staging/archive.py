"""Archive sources (tar, tar.gz, tar.zst): members checked for safety and extracted while staging.

An archive is one stream, so one rank per node extracts it. Its manifest is a sidecar file
`<archive>.mlhpc_manifest.json` or a member `mlhpc_manifest.json` at the archive's root;
without one, checksums are computed from the extracted bytes.

Nothing in an archive is trusted (as with `tarfile.data_filter`): member names and link targets
go through `common/safeio/safepath` (`check_member`, here); `extract` writes the members, never through
a symlink, links last and judged where they really land; the stream itself is read through
`open_archive` (below), which fails the whole archive in one line naming the byte where it is
damaged: Python's tarfile in stream mode takes a garbled header after the first, or a stream
that stops between members, for the end of the archive, and python-zstandard's reader ends
inside a cut frame without a word. Here either is a CorruptArchiveError naming the archive and
the byte, as is a decompressor error or anything but zeros after the end-of-archive block.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import posixpath
import queue
import tarfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import link_target, relative_path
from mlhpc.staging.engine import PARTIAL_SUFFIX, SLICE_BYTES
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest
from mlhpc.staging.source import new_hasher, open_source

ARCHIVE_KINDS = {".tar": "tar", ".tar.gz": "gz", ".tgz": "gz", ".tar.zst": "zst", ".tzst": "zst"}


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

        with open(open_source(path), "rb", closefd=True) as handle:
            try:
                content = zstandard.frame_content_size(handle.read(18))
            except zstandard.ZstdError:
                content = -1  # not a zstd frame: extraction names what is wrong with it
        if content > 0:
            return content
    return size  # a lower bound for a compressed archive; a full disk is still caught while writing


def unchecked_warning(path: Path, kind: str | None) -> str | None:
    """What a manifest-less archive of `kind` cannot promise, as one line; None when its format
    checks its own bytes (gzip's CRC-32 per member; zstd frames with a content checksum)."""
    if kind == "tar":
        why = "a .tar carries no checksum of its members' bytes"
    elif kind == "zst":
        import zstandard

        try:
            with open(open_source(path), "rb", closefd=True) as handle:
                checked = zstandard.get_frame_parameters(handle.read(18)).has_checksum
        except (OSError, StagingError, zstandard.ZstdError):
            return None  # staging names what is wrong with it
        if checked:
            return None
        why = "its zstd frames carry no checksum (zstd --no-check)"
    else:
        return None
    return (
        f"{path} has no manifest and {why}: a damaged byte inside a member is staged unnoticed; "
        f"where the archive was made, write its checksums with: mlhpc manifest {path}"
    )


def check_member(member: tarfile.TarInfo, archive: Path) -> str | None:
    """The member's path inside DEST (None for the root), judged as text: its name, a link's
    target, its type. Where it really lands is judged when it is written (`landing`)."""
    where, fix = f"{archive}: member", "rebuild the archive without it"
    name = relative_path(member.name, where, fix, root_ok=True)
    where = f"{where} {member.name!r}"
    if member.issym():
        link_target(member.linkname, where, fix)
    elif member.islnk():
        relative_path(member.linkname, f"{where} links to", fix)
    elif not (member.isfile() or member.isdir()):
        raise StagingError(f"{where} is a device or FIFO; refused: {fix}")
    if name.endswith(PARTIAL_SUFFIX):
        raise StagingError(f"{where} has the name of a staging temporary file; refused: {fix}")
    return name or None


def member_node(path: str, num_nodes: int) -> int:
    """The node that holds archive member `path` in shard mode (by a hash of its path: an
    archive is streamed, so its members cannot be balanced by size before they are seen)."""
    return xxhash.xxh3_64_intdigest(path.encode()) % num_nodes


def build_archive_manifest(path: Path, algorithm: str = "xxh3_128") -> Manifest:
    """Hash every regular member of an archive (for `mlhpc manifest ARCHIVE`)."""
    kind = archive_kind(path)
    if kind is None:
        raise StagingError(f"{path} is not a .tar, .tar.gz or .tar.zst archive")
    entries = {}
    with open(open_source(path), "rb", closefd=True) as raw, open_archive(raw, kind, path) as tar:
        for member in tar:
            name = check_member(member, path)
            if name is None or not member.isfile() or name == MANIFEST_NAME:
                continue
            if posixpath.basename(name).startswith(".mlhpc"):
                continue  # staging's own files: never extracted
            hasher = new_hasher(algorithm)
            handle = tar.extractfile(member)
            assert handle is not None
            while data := handle.read(SLICE_BYTES):
                hasher.update(data)
            entries[name] = FileEntry(name, member.size, hasher.hexdigest())  # a later copy wins
    return Manifest(algorithm, tuple(sorted(entries.values(), key=lambda f: f.path)))


# ---------------------------------------------------------------- the stream, checked to its end
KIND_NAMES = {"tar": "tar", "gz": "tar.gz", "zst": "tar.zst"}


class CorruptArchiveError(StagingError):
    """An archive stream that is truncated, garbled or not an archive at all."""


def corrupt(archive: Path, kind: str, offset: int, reason: str, inner: bool = False) -> CorruptArchiveError:
    where = f"byte {offset}" + (" of its uncompressed tar stream" if inner and kind != "tar" else "")
    return CorruptArchiveError(
        f"{archive}: corrupt or truncated {KIND_NAMES.get(kind, kind)} archive at {where} ({reason}); "
        "check or rebuild it"
    )


def unchecked_frame(archive: Path, frame: int, offset: int) -> CorruptArchiveError:
    return CorruptArchiveError(
        f"{archive}: zstd frame {frame} at byte {offset} carries no checksum though the first frame "
        "does, so a damaged byte in it would be staged unnoticed; recompress it with checksums (zstd's "
        f"default), or write its manifest where it was made: mlhpc manifest {archive}"
    )


class _ZstdFrames:
    """Follows the frame and block headers of a zstd stream as its bytes pass by, so that a stream
    that ends inside a frame is seen: python-zstandard's reader ends there without a word. It also
    notes the first frame after the first one with a checksum that has none (`unchecked`)."""

    MAGIC = 0xFD2FB528

    def __init__(self) -> None:
        self._want = 4  # header bytes to collect before `_step` can judge them
        self._head = b""
        self._skip = 0  # body bytes to pass over
        self._state = "magic"
        self._checksum = False
        self._consumed = 0  # bytes of the stream fed so far
        self._frames = 0
        self._first_checked: bool | None = None
        self.error: str | None = None
        self.unchecked: tuple[int, int] | None = None
        """(frame number, byte) of a frame without a checksum after a first frame with one."""

    @property
    def between_frames(self) -> bool:
        return self._state == "magic" and not self._head and not self._skip

    def feed(self, data: bytes) -> None:
        view, at = memoryview(data), 0
        while at < len(view) and self.error is None:
            if self._skip:
                step = min(self._skip, len(view) - at)
                self._skip -= step
                at += step
                self._consumed += step
                continue
            take = min(self._want - len(self._head), len(view) - at)
            self._head += bytes(view[at : at + take])
            at += take
            self._consumed += take
            if len(self._head) == self._want:
                head, self._head = self._head, b""
                self._step(head)

    def _step(self, head: bytes) -> None:
        value = int.from_bytes(head, "little")
        if self._state == "magic":
            if value == self.MAGIC:
                self._state, self._want = "descriptor", 1
            elif value & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its length, then its bytes
                self._state, self._want = "skippable", 4
            else:
                self.error = "not a zstd frame"
        elif self._state == "skippable":
            self._skip, self._state, self._want = value, "magic", 4
        elif self._state == "descriptor":
            single = (value >> 5) & 1
            self._checksum = bool((value >> 2) & 1)
            self._note_checksum()
            content = (0 if not single else 1, 2, 4, 8)[value >> 6]
            self._skip = (0 if single else 1) + (0, 1, 2, 4)[value & 3] + content
            self._state, self._want = "block", 3
        elif self._state == "block":
            kind, size = (value >> 1) & 3, value >> 3
            if kind == 3:
                self.error = "reserved zstd block type"
            self._skip = 1 if kind == 1 else size
            if value & 1:  # the frame's last block; then its checksum, if it has one
                self._skip += 4 if self._checksum else 0
                self._state, self._want = "magic", 4

    def _note_checksum(self) -> None:
        self._frames += 1
        if self._first_checked is None:
            self._first_checked = self._checksum
        elif self._first_checked and not self._checksum and self.unchecked is None:
            self.unchecked = (self._frames, self._consumed - 5)  # the frame's magic and descriptor


class _Reader(io.RawIOBase):
    """A raw reader whose subclasses give `read`; `readinto` (what buffered readers call) follows."""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        data = self.read(len(target))
        target[: len(data)] = data
        return len(data)


class _Source(_Reader):
    """The archive's bytes as read (counted); for zstd, judged frame by frame on the way. With
    `every_frame_checked`, a zstd frame without a checksum after a first frame with one is refused
    before its bytes are decompressed: the first frame is what `archive.unchecked_warning` reads,
    so such an archive would be staged with no warning and a damaged byte in that frame unnoticed."""

    def __init__(self, raw: IO[bytes], archive: Path, kind: str, every_frame_checked: bool = False) -> None:
        self._raw, self.archive, self.kind = raw, archive, kind
        self._frames = _ZstdFrames() if kind == "zst" else None
        self._every_frame_checked = every_frame_checked
        self.offset = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size if size and size > 0 else 1 << 20)
        if self._frames is not None:
            self._frames.feed(data)
            if self._frames.error is not None:
                raise corrupt(self.archive, self.kind, self.offset, self._frames.error)
            if not data and not self._frames.between_frames:
                raise corrupt(self.archive, self.kind, self.offset, "the stream ends inside a zstd frame")
            if self._every_frame_checked and self._frames.unchecked is not None:
                raise unchecked_frame(self.archive, *self._frames.unchecked)
        self.offset += len(data)
        return data


class _Decoded(_Reader):
    """The tar bytes of the archive (decompressed); any error of the decompressor or the source
    becomes one CorruptArchiveError naming the byte of the archive where it was met."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.offset = 0
        if source.kind == "gz":  # checks each member's CRC and length, and that the last one ends
            self._reader: Any = gzip.GzipFile(fileobj=source, mode="rb")
        elif source.kind == "zst":
            import zstandard

            self._reader = zstandard.ZstdDecompressor().stream_reader(
                source, read_size=1 << 20, read_across_frames=True
            )
        else:
            self._reader = source

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._reader.read(size if size and size > 0 else 1 << 20)
        except CorruptArchiveError:
            raise
        except (OSError, EOFError, ValueError, zlib.error, *_zstd_errors(self.source.kind)) as e:
            reason = str(e) or type(e).__name__
            raise corrupt(self.source.archive, self.source.kind, self.source.offset, reason) from e
        self.offset += len(data)
        return data


def _zstd_errors(kind: str) -> tuple[type[Exception], ...]:
    if kind != "zst":
        return ()
    import zstandard

    return (zstandard.ZstdError,)


class _BadHeader(tarfile.TarError):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset


class _Header(tarfile.TarInfo):
    """A member header that fails to parse is an error wherever it is: tarfile's stream mode
    takes a bad header after the first, or a stream that stops between members, for the end."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            raise  # a zero block: the end-of-archive marker (what follows is checked at the end)
        except tarfile.EmptyHeaderError as e:
            raise _BadHeader(tar.offset, "the stream ends without an end-of-archive block") from e
        except tarfile.HeaderError as e:
            raise _BadHeader(tar.offset, f"bad member header: {e}") from e


@contextlib.contextmanager
def open_archive(
    raw: IO[bytes], kind: str, archive: Path, every_frame_checked: bool = False
) -> Iterator[tarfile.TarFile]:
    """A streaming TarFile over the raw archive bytes (no seeking: it also reads from a pipe).
    `every_frame_checked`: refuse a .tar.zst that checksums its first frame and not a later one
    (staging with no manifest to check the members against; see `_Source`).

    Whatever is wrong with the stream (a header that fails its checksum, an end before the
    end-of-archive block, data after it, a decompressor error) raises one CorruptArchiveError
    naming the archive and the byte; when the body finishes, the rest of the stream is read and
    must be zeros, so that a compressed stream is also checked to its end."""
    decoded = _Decoded(_Source(raw, archive, kind, every_frame_checked))
    try:
        with tarfile.open(fileobj=decoded, mode="r|", bufsize=1 << 20, tarinfo=_Header) as tar:
            yield tar
            assert tar.fileobj is not None
            while rest := tar.fileobj.read(1 << 20):
                if rest.count(0) != len(rest):
                    raise _BadHeader(tar.offset, "data after the end-of-archive block")
    except _BadHeader as e:
        raise corrupt(archive, kind, e.offset, str(e), inner=True) from e
    except (tarfile.TarError, EOFError, ValueError, OverflowError) as e:
        reason = str(e) or type(e).__name__
        raise corrupt(archive, kind, decoded.offset, reason, inner=True) from e


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
