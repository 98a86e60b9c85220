"""The staging executor: copy planned files under temporary names, verify, rename, mark complete."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.fileio import atomic_write_text
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, build_manifest, hash_file
from mlhpc.staging.plan import CopyOp, plan_node_copies

STAGED_MARKER = ".mlhpc_staged.json"
_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class StageReport:
    """What the node staged (all its ranks together); `metadata()` goes into staging_stop."""

    dest: Path
    files: int
    bytes: int
    seconds: float

    def metadata(self) -> dict[str, float | int]:
        return {
            "staging_duration": self.seconds,
            "staged_files": self.files,
            "staged_bytes": self.bytes,
        }


def stage_dataset(
    src: Path,
    dest: Path,
    *,
    local_rank: int = 0,
    local_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    workers: int = 4,
) -> StageReport:
    """Copy the dataset at `src` into `dest` on this node, split over the node's ranks.

    Uses the source's manifest when it has one (checksums are then verified against it), else
    hashes while copying. The completion marker is written last, by local rank 0.
    """
    src, dest = Path(src), Path(dest)
    started = time.perf_counter()
    if not src.is_dir():
        raise StagingError(f"staging source {src} is not a directory; pass --data DIR holding the dataset")
    manifest_path = src / MANIFEST_NAME
    manifest = Manifest.read(manifest_path) if manifest_path.is_file() else None
    trusted = manifest is not None
    if manifest is None:
        manifest = build_manifest(src)  # on the fly: the copy is checked against this read
    if local_rank == 0:
        (dest / STAGED_MARKER).unlink(missing_ok=True)
        check_free_space(dest, manifest.total_bytes)
    barrier()
    ops = plan_node_copies(manifest, local_rank, local_size)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(lambda op: copy_verified(src, dest, op, manifest.algorithm, trusted), ops))
    barrier()
    if local_rank == 0:
        manifest.write(dest / MANIFEST_NAME)
        marker = {
            "source": str(src.resolve()),
            "files": len(manifest.files),
            "bytes": manifest.total_bytes,
        }
        atomic_write_text(dest / STAGED_MARKER, json.dumps(marker) + "\n")
    barrier()
    return StageReport(
        dest=dest,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        seconds=time.perf_counter() - started,
    )


def copy_verified(src_root: Path, dest_root: Path, op: CopyOp, algorithm: str, trusted: bool) -> None:
    """Copy one file to a temporary name, check size and checksum, then rename it into place."""
    entry = op.entry
    source = src_root / entry.path
    target = dest_root / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.mlhpc-partial")
    try:
        if not source.is_file():
            raise StagingError(
                f"staging source file {source} is missing; restore it or regenerate the dataset"
            )
        if source.stat().st_size != entry.size:
            raise StagingError(
                f"staging source file {source} has {source.stat().st_size} bytes, its manifest says "
                f"{entry.size}; the source changed: regenerate its {MANIFEST_NAME}"
            )
        _kernel_copy(source, tmp)
        got = hash_file(tmp, algorithm)
        if got != entry.checksum:
            where = "the source changed since its manifest was written" if trusted else "the copy is corrupt"
            raise StagingError(f"staged copy of {source} fails its {algorithm} check: {where}; stage again")
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno == 28:
            raise StagingError(
                f"disk full while staging {source} to {target}; free space on {dest_root}"
            ) from e
        raise StagingError(f"cannot stage {source} to {target}: {e.strerror}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def verify_staged(dest: Path) -> int:
    """Re-hash a staged directory against its manifest; returns the file count, raises on a mismatch."""
    dest = Path(dest)
    if not (dest / STAGED_MARKER).is_file():
        raise StagingError(f"{dest} holds no complete staged dataset (no {STAGED_MARKER}); stage it again")
    manifest = Manifest.read(dest / MANIFEST_NAME)
    for entry in manifest.files:
        path = dest / entry.path
        if not path.is_file() or path.stat().st_size != entry.size:
            raise StagingError(f"staged file {path} is missing or has the wrong size; stage again")
        if hash_file(path, manifest.algorithm) != entry.checksum:
            raise StagingError(f"staged file {path} is corrupt ({manifest.algorithm} mismatch); stage again")
    return len(manifest.files)


def check_free_space(dest: Path, needed_bytes: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest).free
    if free < needed_bytes:
        raise StagingError(
            f"not enough space on {dest}: staging needs {needed_bytes} bytes, {free} are free; "
            "set MLHPC_LOCAL_DIR to a larger node-local disk"
        )


def _kernel_copy(source: Path, target: Path) -> None:
    """Copy with os.copy_file_range where the kernel supports it, else a buffered loop."""
    with open(source, "rb") as fin, open(target, "wb") as fout:
        remaining = os.fstat(fin.fileno()).st_size
        try:
            while remaining > 0:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), min(remaining, 1 << 30))
                if copied == 0:
                    break
                remaining -= copied
        except OSError as e:
            if e.errno not in (18, 22, 38, 95):  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP: fall back
                raise
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
            shutil.copyfileobj(fin, fout, _CHUNK_BYTES)
