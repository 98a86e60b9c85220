"""Staging throughput: `mlhpc stage` against `cp -r` on the same data, measured in one run.

Prints MB/s for each and the ratio ours / cp, for a many-small-files and a few-large-files
dataset. The page cache is dropped before each copy when running as root, so both read cold.

    python perf/staging_throughput.py [--small-files 4000] [--large-files 4] [--large-mib 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mlhpc.staging import build_manifest, stage_dataset
from mlhpc.staging.manifest import MANIFEST_NAME


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def make_dataset(root: Path, count: int, size: int) -> int:
    root.mkdir(parents=True)
    block = os.urandom(size)
    for i in range(count):
        (root / f"sample_{i:06d}.npy").write_bytes(block[i % 7 :] + block[: i % 7])
    build_manifest(root).write(root / MANIFEST_NAME)
    return count * size


def timed(action: Callable[[], object]) -> float:
    drop_caches()
    started = time.perf_counter()
    action()
    os.sync()
    return time.perf_counter() - started


def measure(name: str, count: int, size: int, work: Path, workers: int) -> None:
    src = work / f"{name}-src"
    total = make_dataset(src, count, size)
    cp_dest, our_dest = work / f"{name}-cp", work / f"{name}-mlhpc"
    cp_s = timed(lambda: subprocess.run(["cp", "-r", str(src), str(cp_dest)], check=True))
    our_s = timed(lambda: stage_dataset(src, our_dest, workers=workers))
    cp_rate, our_rate = total / cp_s / 1e6, total / our_s / 1e6
    print(
        f"{name:<12} {count:>6} x {size / 2**20:>7.3f} MiB   cp {cp_rate:8.1f} MB/s   "
        f"mlhpc stage {our_rate:8.1f} MB/s   ratio {our_rate / cp_rate:5.2f}"
    )
    for path in (src, cp_dest, our_dest):
        shutil.rmtree(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small-files", type=int, default=4000)
    parser.add_argument("--small-kib", type=int, default=64)
    parser.add_argument("--large-files", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: system temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        work = Path(scratch)
        print(f"cold cache: {drop_caches()}  (verified copy: xxh3_128 of every staged file)")
        measure("small-files", args.small_files, args.small_kib << 10, work, args.workers)
        measure("large-files", args.large_files, args.large_mib << 20, work, args.workers)


if __name__ == "__main__":
    main()
