"""A study's dataset and its page cache: made once (incompressible files with a manifest), read
once as a first epoch does, and cold before each copy.

Every timing starts from a cold source: its own pages evicted from the page cache before each
copy (`evict`, any user), and the whole cache dropped once per dataset by the caller as root
(`drop_caches`; never before each step: that costs the whole machine).
"""

from __future__ import annotations

import os
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.staging.manifest import MANIFEST_NAME, build_manifest


def drop_caches() -> bool:
    """Write back and drop the page cache (root only); False when not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def evict(src: Path) -> bool:
    """Drop the page cache of `src`'s own files (posix_fadvise DONTNEED on each): cold data for
    the next copy, without root and without emptying the rest of the machine's cache. Dirty
    pages stay (write them back first); False where the platform has no fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in source_files(src):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue  # the copy will name it
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def make_dataset(root: Path, total_bytes: int, file_bytes: int) -> int:
    """Files of `file_bytes` (incompressible) adding up to about `total_bytes`, with a manifest,
    in folders of 1,000 as real datasets are laid out. Returns the file count. A `root` that
    has a manifest is reused as it is; one that holds anything else is refused (never written
    over: it is someone's folder)."""
    count = max(1, total_bytes // file_bytes)
    if (root / MANIFEST_NAME).is_file():
        return count
    if root.is_symlink() or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
        raise StagingError(
            f"{root} exists and is not a dataset the study made (no {MANIFEST_NAME}); "
            "move it away or pass another --scratch"
        )
    block = os.urandom(min(file_bytes, 64 << 20) + 64)
    for i in range(count):
        path = root / f"part{i // 1000:04d}" / f"sample_{i:07d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            left = file_bytes
            while left:
                piece = block[i % 64 : i % 64 + min(left, len(block) - 64)]
                handle.write(piece)
                left -= len(piece)
    build_manifest(root).write(root / MANIFEST_NAME)
    return count


SETTLE_S = 3.0
"""Pause after dropping the cache. In a VM with free-page reporting the freed pages go back to
the host within ~2 s, and a copy that allocates page cache right after a drop gets them cheaply,
one started later pays a host fault for each: the pause gives every method the same start."""


def read_all(root: Path) -> None:
    """Read every file under `root` once, as a first epoch does."""
    buffer = bytearray(1 << 20)
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb", buffering=0) as handle:
                while handle.readinto(buffer):
                    pass


def source_files(src: Path) -> list[Path]:
    """The files a staging of `src` reads: the archive itself, or every file below the directory."""
    return [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())


def fresh_path(path: Path) -> Path:
    """`path`, refused when something is there already: a measure removes only what it made."""
    if path.exists() or path.is_symlink():
        raise StagingError(f"{path} exists already; the study writes only where nothing is (move it away)")
    return path
