"""The resume journal: the files each process verified into the destination, so that a rerun
skips them, and the node's manifest is made from them."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safepath import relative_path
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_file
from mlhpc.staging.sink import SinkOptions, Staged, staged_path, write_error

log = logging.getLogger(__name__)
JOURNAL_PREFIX = ".mlhpc_journal."
JOURNAL_BATCH = 64
JOURNAL_DELAY_S = 1.0
_journals: dict[str, Journal] = {}
_journals_lock = threading.Lock()


class Journal:
    """Per-process log of verified files in the destination: what a rerun may skip, and what
    the node's manifest is made from.

    One line per file, recorded after the file was renamed into place and appended in batches
    (`JOURNAL_BATCH` lines or `JOURNAL_DELAY_S`, whichever comes first; `flush` and `close`
    write the rest): with an append per file, threads wait on the file's lock, which cost about
    40 of the ~250 us of CPU a 64 KiB file took with 8 threads here. A process killed mid-batch
    loses that batch's lines, so a rerun checks those files again against the source's
    checksums, or copies them again.
    """

    def __init__(self, dest_root: str) -> None:
        self.path = os.path.join(dest_root, f"{JOURNAL_PREFIX}{os.getpid()}.jsonl")
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as e:  # a destination's fault, not the source file's that was being copied
            raise write_error(e, self.path) from e
        self._lines: list[str] = []
        self._first_at = 0.0
        self._lock = threading.Lock()

    def record(self, staged: Staged) -> None:
        self.record_many([staged])

    def record_many(self, staged: Sequence[Staged]) -> None:
        lines = [json.dumps([s.path, s.size, s.checksum, s.source, s.source_checksum]) for s in staged]
        with self._lock:
            if not self._lines:
                self._first_at = time.monotonic()
            self._lines.extend(lines)
            if len(self._lines) < JOURNAL_BATCH and time.monotonic() - self._first_at < JOURNAL_DELAY_S:
                return
        self.flush()

    def flush(self) -> None:
        """Append the lines recorded so far (one write: a crash cuts at most its last line)."""
        with self._lock:
            lines, self._lines = self._lines, []
            if lines:
                try:
                    os.write(self._fd, "".join(f"{line}\n" for line in lines).encode())
                except OSError as e:
                    raise write_error(e, self.path) from e

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self._fd)


def journal(dest_root: str) -> Journal:
    """This process's journal in `dest_root`, opened on first use."""
    with _journals_lock:
        if dest_root not in _journals:
            _journals[dest_root] = Journal(dest_root)
        return _journals[dest_root]


def close_journal(dest_root: str) -> None:
    with _journals_lock:
        found = _journals.pop(dest_root, None)
    if found is not None:
        found.close()


def read_journals(dest: Path) -> dict[str, Staged]:
    """Everything earlier runs verified into `dest`, by source path: its journals and manifest."""
    found: dict[str, Staged] = {}
    manifest_path = dest / MANIFEST_NAME
    if manifest_path.is_file():
        try:
            for f in Manifest.read(manifest_path).files:
                found[f.path] = Staged(f.path, f.size, f.checksum, f.path, "")
        except StagingError:
            pass  # a broken manifest in the destination only means nothing is skipped
    journals = sorted(dest.glob(f"{JOURNAL_PREFIX}*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    for path in journals:  # oldest first, so the latest record of a file wins
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        try:
            records = json.loads(f"[{','.join(lines)}]")
        except ValueError:  # a line cut short when its process was killed: keep the good ones
            records = [r for r in map(_parse_line, lines) if r is not None]
        where = f"{path}: record"
        for fields in records:
            if (record := _record(fields, where)) is not None:
                found[record.source] = record
    return found


def _parse_line(line: str) -> list[Any] | None:
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    return fields if isinstance(fields, list) and len(fields) == 5 else None


_TYPES = (str, int, str, str, str)


def _record(fields: Any, where: str) -> Staged | None:
    """A journal line as a record, or None (ignored: a rerun copies that file again) if it is
    not one or names a path that leaves DEST (`relative_path` judges both of its paths)."""
    if not isinstance(fields, list) or len(fields) != 5:
        return None
    if not all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(fields, _TYPES, strict=True)):
        return None
    try:
        path, source = (relative_path(fields[i], where, "it is ignored") for i in (0, 3))
    except StagingError as e:
        log.warning("%s", e)
        return None
    return Staged(path, fields[1], fields[2], source, fields[4])


def already_staged(
    dest: Path, entry: FileEntry, evidence: dict[str, Staged], options: SinkOptions
) -> Staged | None:
    """`entry`'s copy in `dest` if it is there already and still verifies (a rerun skips it)."""
    record = evidence.get(entry.path)
    path = staged_path(entry.path, options)
    if record is not None and (
        record.path != path or (entry.checksum and record.source_checksum not in ("", entry.checksum))
    ):
        record = None
    if record is None and entry.checksum and path == entry.path:
        record = Staged(path, entry.size, entry.checksum, entry.path, entry.checksum)
    if record is None:
        return None
    target = dest / path
    try:
        if target.stat().st_size == record.size and hash_file(target, options.algorithm) == record.checksum:
            return record
    except (OSError, StagingError):
        pass
    return None
