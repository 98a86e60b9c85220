"""Extracting one archive stream into DEST while staging: every member checked
(`archive.check_member`), written under a temporary name and renamed, verified against the
archive's manifest where there is one; links made last and judged where they really land.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import stat
import tarfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio.safepath import inside, landing, relative_path
from mlhpc.staging.archive import CorruptArchiveError, check_member, open_archive
from mlhpc.staging.engine import SLICE_BYTES, Partial, Staged, checked_dirs
from mlhpc.staging.journal import already_staged, journal
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest
from mlhpc.staging.request import CopyOptions

log = logging.getLogger(__name__)
_POOLED_MEMBER_BYTES = 16 << 20  # smaller members are written by the thread pool
_IN_FLIGHT_BYTES = 256 << 20


class ArchiveExtractor:
    """Extract one archive stream into `dest`: every member verified, written under a temporary
    name and renamed; `keep(path)` picks the regular files this node holds."""

    def __init__(
        self,
        archive: Path,
        dest: Path,
        options: CopyOptions,
        manifest: Manifest | None,
        evidence: dict[str, Staged],
        keep: Callable[[str], bool] = lambda path: True,
        workers: int = 8,
        on_done: Callable[[list[Staged]], None] = lambda staged: None,
        origin: str = "",
    ) -> None:
        self.archive = archive
        self.origin = origin
        """The archive's identity when it was opened: every member's record carries it, and a
        rerun keeps a member only when the archive's identity is still this one."""
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
        self._links: dict[str, tarfile.TarInfo] = {}
        """Link members by name, made after the files in archive order (a later member wins)."""
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers))
        self._futures: list[Future[Staged]] = []
        self._budget = threading.BoundedSemaphore(_IN_FLIGHT_BYTES >> 20)
        self._lock = threading.Lock()
        self._real_dirs = checked_dirs(str(dest), fresh=True)
        """Directories under `dest` seen to be real ones (no symlink), shared with the engine;
        links are made last and never replace a directory, so they stay real."""
        self._real_dest = os.path.realpath(dest)
        self._seen: set[str] = set()
        self.folders: dict[str, int] = {}
        """Folder members and their modes, made and given their modes once all is extracted."""

    def run(self, raw: IO[bytes], kind: str) -> list[Staged]:
        """Extract everything; on any error, wait for the writers and raise it. The links come
        last, so that no file is ever written through a link the archive made."""
        try:
            # No sidecar manifest: zstd's frame checksums are all that check the bytes, so each frame needs one.
            with open_archive(raw, kind, self.archive, every_frame_checked=self.expected is None) as tar:
                for member in tar:
                    self._take(tar, member)
            self._drain()
        except CorruptArchiveError:
            self._pool.shutdown(wait=True, cancel_futures=True)
            for staged in self.written:  # made from a stream that went bad: none of it is kept
                (self.dest / staged.path).unlink(missing_ok=True)
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._check_complete()
        made = []
        for member in self._links.values():
            try:
                made.append(self._link(member))
            except OSError as e:
                raise StagingError(
                    f"{self.archive}: member {member.name!r}: cannot make the link ({e.strerror}); "
                    "check the node-local directory, or rebuild the archive without it"
                ) from e
        self._check_symlinks([path for path in made if path is not None])
        self._make_folders()
        return list(self.staged.values())

    def _make_folders(self) -> None:
        """Make the archive's folders (empty ones too) and give them their modes as tar does for
        a user that is not root: the umask applied, no setuid, setgid or sticky bit, and the
        owner's rwx kept (a rerun writes there)."""
        umask = 0o022 if self.options.umask is None else self.options.umask
        fix = "rebuild the archive without it"
        for name, mode in sorted(self.folders.items()):
            path = landing(str(self.dest), f"{name}/x", f"{self.archive}: member", fix, self._real_dirs)
            folder = os.path.dirname(path)
            os.makedirs(folder, exist_ok=True)
            if stat.S_ISDIR(os.lstat(folder).st_mode):
                os.chmod(folder, mode & 0o777 & ~umask | 0o700)

    def _take(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = check_member(member, self.archive)
        if name is not None and member.isdir() and not posixpath.basename(name).startswith(".mlhpc"):
            self.folders[name] = member.mode
        if name is None or member.isdir() or posixpath.basename(name).startswith(".mlhpc"):
            return
        member.name = name
        if name == MANIFEST_NAME and member.isfile():
            self._take_manifest(tar.extractfile(member))
        elif member.issym() or member.islnk():
            self._links.pop(name, None)  # moved to its place in archive order
            self._links[name] = member
        else:
            self._links.pop(name, None)  # a file after a link of that name: the file wins
            if self.keep(name):
                self._member(tar, member)

    def _land(self, name: str) -> str:
        """Where member `name` is written: refused if a directory on the way is a symlink."""
        where = f"{self.archive}: member"
        return landing(str(self.dest), name, where, "rebuild the archive without it", self._real_dirs)

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        path = self._land(member.name)
        if os.path.islink(path):  # a link left by an earlier run: the archive says a file goes here
            os.unlink(path)
        if member.name in self._seen:  # a later copy of a member wins, after the earlier one is written
            self._drain()
        self._seen.add(member.name)
        entry = self._entry(member.name, member.size)
        if (kept := already_staged(self.dest, entry, self.evidence, self.options, self.origin)) is not None:
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
            self._futures.append(self._pool.submit(self._write, entry, [data], megabytes, member.mode))
            if len(self._futures) > 4096:
                self._drain(done_only=True)
            return
        self._write(entry, iter(lambda: handle.read(SLICE_BYTES), b""), 0, member.mode)

    def _write(self, entry: FileEntry, pieces: Iterable[bytes], megabytes: int, mode: int) -> Staged:
        """Write one member; it keeps its mode (the engine drops setuid, setgid, sticky), and u+rw,
        so that staging can read it back to verify it and write it again on a rerun."""
        try:
            with Partial(str(self.dest), entry, self.options, mode | 0o600, self.origin) as partial:
                for piece in pieces:
                    partial.write(piece)
                staged = partial.finish()
        finally:
            for _ in range(megabytes):
                self._budget.release()
        journal(str(self.dest), self.options.run_token).record(staged)
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

    def _link(self, member: tarfile.TarInfo) -> str | None:
        """Make one link member; returns its path if it is a symlink. A link is judged where it
        really lands, on the tree as it is now (links made before it included), as
        `tarfile.data_filter` does: it must stay under DEST, and no directory on its way may
        be a symlink."""
        where, fix = f"{self.archive}: member {member.name!r}", "rebuild the archive without it"
        path = landing(str(self.dest), member.name, f"{self.archive}: member", fix)
        if member.issym():
            if not inside(os.path.join(os.path.dirname(path), member.linkname), self._real_dest):
                raise StagingError(f"{where} links to {member.linkname!r}, outside DEST; refused: {fix}")
            self._clear(path, where)
            os.symlink(member.linkname, path)
            self.staged.pop(member.name, None)  # an earlier file of that name is replaced
            return path
        source = relative_path(member.linkname, f"{where} links to", fix)
        if source not in self.staged:
            log.warning(
                "%s: hard link %s -> %s: target not on this node; skipped", self.archive, member.name, source
            )
            return None
        linked = self.staged[source]
        origin = landing(str(self.dest), linked.path, f"{where} links to", fix)
        if not stat.S_ISREG(os.lstat(origin).st_mode):
            raise StagingError(f"{where} links to {source!r}, which is no longer a regular file; {fix}")
        self._clear(path, where)
        os.link(origin, path, follow_symlinks=False)
        self.staged[member.name] = Staged(
            member.name, linked.size, linked.checksum, member.name, linked.checksum, self.origin
        )
        return None

    def _clear(self, path: str, where: str) -> None:
        """Make room for a link at `path`: its directory made, an earlier file or link removed."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                raise StagingError(f"{where} would replace a directory; refused: rebuild the archive")
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _check_symlinks(self, made: list[str]) -> None:
        """A link made later can change where an earlier one leads (`x -> b/../..` is inside
        DEST until `b -> .` is made): once all are made, each must still resolve under DEST."""
        for path in made:
            if os.path.islink(path) and not inside(path, self._real_dest):
                target = os.readlink(path)
                os.unlink(path)
                name = os.path.relpath(path, self.dest)
                raise StagingError(
                    f"{self.archive}: member {name!r} links to {target!r}, which leads outside DEST "
                    "through links made after it; refused: rebuild the archive without it"
                )
