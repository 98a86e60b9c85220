"""A dataset folder's files, or any folder's whole tree, read back for comparison."""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path

from mlhpc.staging.source import RACY_NS


def dataset_files(root: Path) -> dict[str, bytes]:
    """A dataset's files by relative path (bytes), without manifests and staging bookkeeping."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.name != "mlhpc_manifest.json"
    }


def tree(root: Path, *, folders: bool = False, skip: Collection[str] = ()) -> dict[str, bytes | str | None]:
    """Everything under `root` by relative path, what a test compares before and after to show
    nothing changed: a file's bytes, a link's target (a str; never followed), and with `folders`
    each folder as None; names in `skip` left out. A `root` that is a file or a link is the one
    entry "" (its bytes or its target)."""
    if root.is_symlink():
        return {"": os.readlink(root)}
    if root.is_file():
        return {"": root.read_bytes()}
    found: dict[str, bytes | str | None] = {}
    for folder, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(folder, name)
            if name in skip:
                continue
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[relative] = os.readlink(path)
            elif path.is_dir():
                if folders:
                    found[relative] = None
            elif path.is_file():
                found[relative] = path.read_bytes()
    return dict(sorted(found.items()))


def two_file_source(root: Path, *, settled: bool = False) -> Path:
    """A source folder of two files, `a.bin` and `sub/b.bin`; `settled`: old enough that a
    staging records their identity (a file changed within RACY_NS is copied again on a rerun)."""
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 100)
    (root / "sub" / "b.bin").write_bytes(b"b" * 50)
    if settled:
        time.sleep(2 * RACY_NS / 1e9)
    return root
