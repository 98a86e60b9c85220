"""The manifest of a dataset: relative path, size and checksum of every file.

A generator writes it beside the data (`mlhpc manifest` for any dataset); staging
verifies each copy against it, and for a source without one lists the files and computes the
checksums on the fly from the bytes it copies.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio import safe_json
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.safepath import relative_path
from mlhpc.staging.source import HASH_ALGORITHMS, SOURCE_FIX, new_hasher, not_regular, open_source

MANIFEST_NAME = "mlhpc_manifest.json"
MAX_MANIFEST_BYTES = 4 << 30
"""About 30 million files at ~130 bytes a line: any real dataset's manifest, not a disk's worth."""
_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Path relative to the dataset root, with '/' separators."""
    size: int
    checksum: str
    """Hex digest of the file's bytes; "" in a listing whose checksums are not known yet."""


@dataclass(frozen=True)
class Manifest:
    algorithm: str
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "files": [{"path": f.path, "size": f.size, "checksum": f.checksum} for f in self.files],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: Path) -> Manifest:
        """Parse and judge a manifest: every path is checked here (`relative_path`), so no
        consumer can read or write outside SRC or DEST through one."""
        try:
            where = f"{source}: manifest entry"
            if not isinstance(data, dict) or not isinstance(data["files"], list):
                raise TypeError("it is not an object with a list of files")
            files = tuple(_entry(f, where) for f in data["files"])
            algorithm = str(data["algorithm"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise StagingError(f"{source}: malformed manifest ({e}); delete it to recompute") from e
        if algorithm not in HASH_ALGORITHMS:
            raise StagingError(f"{source}: unknown checksum algorithm {algorithm!r}; use {HASH_ALGORITHMS}")
        if len({f.path for f in files}) != len(files):
            twice = next(path for path, n in Counter(f.path for f in files).items() if n > 1)
            raise StagingError(f"{source}: manifest lists {twice!r} twice; {_FIX}")
        return cls(algorithm, files)

    def write(self, path: Path) -> None:
        """One file a line: readable, diffable, and fast to write for hundreds of thousands."""
        lines = ",\n".join(
            json.dumps({"path": f.path, "size": f.size, "checksum": f.checksum}) for f in self.files
        )
        atomic_write_text(path, f'{{"algorithm": {json.dumps(self.algorithm)}, "files": [\n{lines}\n]}}\n')

    def digest(self) -> str:
        """One checksum over every (path, size, checksum): equal digests mean equal copies."""
        hasher = xxhash.xxh3_128()
        for f in sorted(self.files, key=lambda f: f.path):
            hasher.update(f"{f.path}\0{f.size}\0{f.checksum}\n".encode())
        return hasher.hexdigest()

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Read and judge a manifest file: never a FIFO or device (refused without blocking),
        bounded in size and nesting, finite numbers (`safe_json`): a bad one is one line."""
        try:
            data = safe_json.load_file(path, dict, max_bytes=MAX_MANIFEST_BYTES)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise StagingError(f"{path}: cannot read manifest ({reason}); delete it to recompute") from e
        return cls.from_json(data, path)


_FIX = "fix the entry or write the manifest again (mlhpc manifest SRC)"


def _entry(f: dict[str, Any], where: str) -> FileEntry:
    if not isinstance(f, dict):
        raise TypeError(f"entry {str(f)[:60]!r} is not an object")
    path, size, checksum = f["path"], f["size"], f["checksum"]
    if not isinstance(path, str):
        raise TypeError(f"path {path!r} is not a string")
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(checksum, str):
        raise TypeError(
            f"{path!r}: size {str(size)[:40]} or checksum {str(checksum)[:40]} is not of its type"
        )
    entry = FileEntry(relative_path(path, where, _FIX), size, checksum)
    if entry.size < 0:
        raise ValueError(f"{path!r} has a negative size")
    return entry


def hash_file(path: Path, algorithm: str = "xxh3_128", fix: str = SOURCE_FIX) -> str:
    """The checksum of a regular file; a FIFO or device is refused (naming it and `fix`) without
    blocking (`source.open_source`)."""
    return _hash_and_head(path, algorithm, fix)[0]


def _hash_and_head(path: Path, algorithm: str, fix: str = SOURCE_FIX) -> tuple[str, bytes]:
    """(checksum, first chunk): the head tells an HDF5 file by its signature at no extra read."""
    hasher = new_hasher(algorithm)
    head = b""
    try:
        with open(open_source(path, fix=fix), "rb", closefd=True) as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                head = head or chunk
                hasher.update(chunk)
    except OSError as e:
        raise StagingError(f"{path}: cannot read ({e.strerror}); check the file and its permissions") from e
    return hasher.hexdigest(), head


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(head: bytes) -> bool:
    """HDF5's superblock starts at 0 or, after a user block, at 512, 1024, 2048, ... bytes."""
    offsets = [0, *(512 << k for k in range(14))]
    return any(head[o : o + 8] == _HDF5_SIGNATURE for o in offsets if o < len(head))


def _refuse_hdf5_reaching_out(path: Path) -> None:
    """An HDF5 file whose data lives in other files (external storage, virtual datasets,
    external links) is refused here as every reader refuses it (`datasets.open_h5`): a manifest
    would otherwise vouch for a sample whose bytes it never hashed."""
    from mlhpc.common.errors import DataError
    from mlhpc.common.safeio.datasets import open_h5

    try:
        open_h5(path).close()
    except DataError as e:
        raise StagingError(str(e)) from e
    except (OSError, KeyError, ValueError, TypeError, RuntimeError):
        pass  # damaged or not HDF5 after all: the manifest records bytes; the reader says what is wrong


def list_dataset_files(root: Path) -> list[str]:
    """Every file under `root` (relative, sorted), except the manifest and staging markers.

    A symlinked directory is not entered (`os.walk` does not follow links), so the walk stays
    under `root`; a symlinked file is listed, as the dataset's owner made it. Each name is
    judged like a manifest's, so a name no manifest could hold is refused here already, and so is
    a FIFO, socket or device (judged by its type, never opened: opening a FIFO blocks)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name == MANIFEST_NAME or name.startswith(".mlhpc"):
                continue
            rel = Path(dirpath, name).relative_to(root).as_posix()
            found.append(relative_path(rel, f"{root}: file", "rename it, or stage a copy without it"))
            _refuse_special(os.path.join(dirpath, name))
    return sorted(found)


def _refuse_special(path: str) -> None:
    """A listed name that is not a regular file (links followed) is refused in one line."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise StagingError(f"{path}: cannot stat ({e.strerror}); check the file") from e
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode, SOURCE_FIX)


def scan_dataset(root: Path, algorithm: str = "xxh3_128") -> Manifest:
    """List every file under `root` with its size; checksums are left empty (computed when copied)."""
    root = Path(root)
    entries = []
    for name in list_dataset_files(root):
        try:
            size = (root / name).stat().st_size
        except OSError as e:
            raise StagingError(f"{root / name}: cannot stat ({e.strerror}); check the file") from e
        entries.append(FileEntry(name, size, ""))
    return Manifest(algorithm, tuple(entries))


def build_manifest(
    root: Path, algorithm: str = "xxh3_128", files: Iterable[str] | None = None, workers: int = 8
) -> Manifest:
    """Hash every file under `root` (or just `files`, relative paths), `workers` files at a time."""
    root = Path(root)
    names = list(files) if files is not None else list_dataset_files(root)

    def entry(name: str) -> FileEntry:
        checksum, head = _hash_and_head(root / name, algorithm)  # judges the file's type first
        if _is_hdf5(head):
            _refuse_hdf5_reaching_out(root / name)
        return FileEntry(name, (root / name).stat().st_size, checksum)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return Manifest(algorithm, tuple(pool.map(entry, names)))
