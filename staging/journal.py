"""The resume journal: the files each process verified into the destination, so that a rerun
skips them, and the node's manifest is made from them."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio import safe_json
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.safe_read import read_bytes
from mlhpc.common.safeio.safepath import relative_path
from mlhpc.staging.engine import Staged, staged_path, write_error
from mlhpc.staging.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, FileEntry, Manifest, hash_file
from mlhpc.staging.request import CopyOptions

log = logging.getLogger(__name__)
STAGED_MARKER = ".mlhpc_staged.json"
"""Written last in DEST, when every file of the node verified: a folder without it is not staged."""
JOURNAL_PREFIX = ".mlhpc_journal."
SOURCES_NAME = ".mlhpc_sources.jsonl"
"""Every file a completed staging holds, with what it was made from (the journals' lines, one
file a node): the evidence a later restage keeps a copy on, and `mlhpc verify` checks the source
against."""
_JOURNAL = re.compile(r"\.mlhpc_journal\.(?:(?P<token>[0-9a-f]{12})\.)?\d+\.jsonl")
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

    def __init__(self, dest_root: str, token: str = "") -> None:
        name = (
            f"{JOURNAL_PREFIX}{token}.{os.getpid()}.jsonl"
            if token
            else f"{JOURNAL_PREFIX}{os.getpid()}.jsonl"
        )
        self.path = os.path.join(dest_root, name)
        # Never through a link, never waiting on a FIFO planted at the name (it fails instead).
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
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
        lines = [record_line(s) for s in staged]
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


def record_line(s: Staged) -> str:
    return json.dumps([s.path, s.size, s.checksum, s.source, s.source_checksum, s.origin])


def journal(dest_root: str, token: str = "") -> Journal:
    """This process's journal in `dest_root`, opened on first use (named with the run's `token`)."""
    with _journals_lock:
        if dest_root not in _journals:
            _journals[dest_root] = Journal(dest_root, token)
        return _journals[dest_root]


def close_journal(dest_root: str) -> None:
    with _journals_lock:
        found = _journals.pop(dest_root, None)
    if found is not None:
        found.close()


def read_journals(dest: Path) -> dict[str, Staged]:
    """Everything earlier runs verified into `dest`, by source path: its manifest, the sources
    file of a completed staging and the journals (oldest first, so the latest record wins).

    Nothing here is trusted: a file that is not a regular one, too large, or not JSON, and any
    record that is not one, only means that a rerun copies those files again."""
    found: dict[str, Staged] = {}
    manifest_path = dest / MANIFEST_NAME
    if manifest_path.is_file():
        try:
            for f in Manifest.read(manifest_path).files:
                found[f.path] = Staged(f.path, f.size, f.checksum, f.path, "")
        except StagingError:
            pass  # a broken manifest in the destination only means nothing is skipped
    paths = [dest / SOURCES_NAME] if (dest / SOURCES_NAME).is_file() else []
    paths += sorted(journal_files(dest), key=lambda p: p.stat().st_mtime_ns)
    for path in paths:
        for fields in _records(path):
            if (record := _record(fields, f"{path}: record")) is not None:
                found[record.source] = record
    return found


def read_sources(dest: Path) -> list[Staged]:
    """The records of a completed staging's sources file (empty when it has none)."""
    path = dest / SOURCES_NAME
    if not path.is_file():
        return []
    found = (_record(fields, f"{path}: record") for fields in _records(path))
    return [record for record in found if record is not None]


def journal_files(dest: Path) -> list[Path]:
    """The journals in `dest`: regular files named as a journal is (a link or a FIFO is no journal)."""
    out = []
    for path in dest.glob(f"{JOURNAL_PREFIX}*.jsonl"):
        try:
            if _JOURNAL.fullmatch(path.name) and stat.S_ISREG(os.lstat(path).st_mode):
                out.append(path)
        except OSError:
            continue
    return out


def _records(path: Path) -> list[Any]:
    """A journal's lines as JSON values: all at once (fast), else line by line keeping the good
    ones (a line cut short when its process was killed, or one planted to break the parser)."""
    try:
        text = read_bytes(path, MAX_MANIFEST_BYTES, what="a staging journal").decode("utf-8", "replace")
    except OSError as e:
        log.warning("%s: %s; its records are ignored (those files are copied again)", path, e.strerror or e)
        return []
    lines = text.splitlines()
    try:
        records = json.loads(f"[{','.join(lines)}]", parse_constant=_no_constant)
        if all(isinstance(r, list) and len(r) <= 6 for r in records):
            return records
    except (ValueError, RecursionError):
        pass
    return [r for r in map(_parse_line, lines) if r is not None]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def write_sources(dest: Path, held: list[Staged]) -> None:
    """Write what the node holds, with what each file was made from (`SOURCES_NAME`)."""
    text = "".join(f"{record_line(s)}\n" for s in sorted(held, key=lambda s: s.path))
    atomic_write_text(dest / SOURCES_NAME, text)


def remove_journals(dest: Path, tokens: set[str]) -> None:
    """Remove the journals of staging runs DEST's bookkeeping records (`tokens`), once their
    lines are in the sources file: a file of a journal's name that no run of ours made stays."""
    for path in journal_files(dest):
        match = _JOURNAL.fullmatch(path.name)
        if match is not None and match.group("token") in tokens:
            path.unlink(missing_ok=True)


def _parse_line(line: str) -> list[Any] | None:
    try:
        fields = safe_json.loads(line, list, max_depth=2)
    except ValueError:
        return None
    return fields if len(fields) in (5, 6) else None


_TYPES = (str, int, str, str, str, str)


def _record(fields: Any, where: str) -> Staged | None:
    """A journal line as a record, or None (ignored: a rerun copies that file again) if it is
    not one or names a path that leaves DEST (`relative_path` judges both of its paths)."""
    if not isinstance(fields, list) or len(fields) not in (5, 6):
        return None
    if not all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(fields, _TYPES, strict=False)):
        return None
    if fields[1] < 0:
        return None
    try:
        path, source = (relative_path(fields[i], where, "it is ignored") for i in (0, 3))
    except StagingError as e:
        log.warning("%s", e)
        return None
    return Staged(path, fields[1], fields[2], source, fields[4], fields[5] if len(fields) == 6 else "")


def already_staged(
    dest: Path, entry: FileEntry, evidence: dict[str, Staged], options: CopyOptions, origin: str
) -> Staged | None:
    """`entry`'s copy in `dest` if a rerun may keep it, else None (it is copied again).

    `origin` is the source file's identity now (`origin.current_identity`; for an archive member,
    the archive's). A copy mlhpc recorded with its source's identity is kept only when that
    identity is still `origin` and, where the source has a manifest, the checksum it was
    copied against is still the manifest's: a source changed since the copy (size, bytes, a
    mtime set back: the ctime moves) or a regenerated manifest is copied again. A copy without
    a recorded identity (another tool's copy, a file received from another node) is kept only
    on a manifest's checksum. Either way the copy itself is re-hashed."""
    record = evidence.get(entry.path)
    path = staged_path(entry.path, options)
    if record is not None and record.path != path:
        record = None
    if record is not None and record.origin:
        if not origin or record.origin != origin:
            return None  # the source changed since it was copied (or cannot be judged)
        if entry.checksum and record.source_checksum != entry.checksum:
            return None  # the manifest changed since: the copy was checked against another
    elif entry.checksum and path == entry.path:
        record = Staged(path, entry.size, entry.checksum, entry.path, entry.checksum)
    elif not (entry.checksum and record is not None and record.source_checksum == entry.checksum):
        return None  # no evidence of what the copy was made from
    assert record is not None
    target = dest / path
    try:
        if target.stat().st_size == record.size and hash_file(target, options.algorithm) == record.checksum:
            return record
    except (OSError, StagingError):
        pass
    return None
