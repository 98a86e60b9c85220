"""The manifest of a dataset: relative path, size and checksum of every file.

A generator writes it beside the data; staging verifies each copy against it, and computes
it on the fly for a source that has none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.common.fileio import atomic_write_text

MANIFEST_NAME = "mlhpc_manifest.json"
HASH_ALGORITHMS = ("xxh3_128", "sha256")
_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Path relative to the dataset root, with '/' separators."""
    size: int
    checksum: str


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
        try:
            files = tuple(
                FileEntry(str(f["path"]), int(f["size"]), str(f["checksum"])) for f in data["files"]
            )
            algorithm = str(data["algorithm"])
        except (KeyError, TypeError, ValueError) as e:
            raise StagingError(f"{source}: malformed manifest ({e}); delete it to recompute") from e
        if algorithm not in HASH_ALGORITHMS:
            raise StagingError(f"{source}: unknown checksum algorithm {algorithm!r}; use {HASH_ALGORITHMS}")
        return cls(algorithm, files)

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> Manifest:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise StagingError(f"{path}: cannot read manifest ({e}); delete it to recompute") from e
        return cls.from_json(data, path)


def new_hasher(algorithm: str) -> Any:
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise StagingError(f"unknown checksum algorithm {algorithm!r}; use one of {HASH_ALGORITHMS}")


def hash_file(path: Path, algorithm: str = "xxh3_128") -> str:
    hasher = new_hasher(algorithm)
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                hasher.update(chunk)
    except OSError as e:
        raise StagingError(f"{path}: cannot read ({e.strerror}); check the file and its permissions") from e
    return hasher.hexdigest()


def list_dataset_files(root: Path) -> list[str]:
    """Every regular file under `root` (relative, sorted), except the manifest and staging markers."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name == MANIFEST_NAME or name.startswith(".mlhpc"):
                continue
            found.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(found)


def build_manifest(root: Path, algorithm: str = "xxh3_128", files: Iterable[str] | None = None) -> Manifest:
    """Hash every file under `root` (or just `files`, relative paths)."""
    root = Path(root)
    names = list(files) if files is not None else list_dataset_files(root)
    entries = tuple(
        FileEntry(name, (root / name).stat().st_size, hash_file(root / name, algorithm)) for name in names
    )
    return Manifest(algorithm, entries)
