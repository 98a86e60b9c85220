"""The copies `mlhpc stage` is measured against (`cp -r`, `tar | tar`, parallel `dd`) and the raw
disk measures, timed in rounds in which every method takes its turn."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.staging.request import StageRequest
from mlhpc.staging.stage import stage_dataset
from mlhpc.study import dataset
from mlhpc.study.clock import Timing, median_timing, user_clock
from mlhpc.study.raw import RAW_DEPTHS, raw_copy_seconds, raw_read_seconds, raw_write_seconds


def _copy_timing(copy: Callable[[], object], src: Path, dest: Path, cold: bool) -> Timing:
    """`user_clock(copy)` from a cold `src` into a `dest` that does not exist before (else refused)
    and is removed after: this call made it."""
    dataset.fresh_path(dest)
    try:
        if cold:
            dataset.evict(src)
        return user_clock(copy, dest)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def cp_timing(src: Path, dest: Path, cold: bool = True) -> Timing:
    return _copy_timing(
        lambda: subprocess.run(["cp", "-r", str(src), str(dest)], check=True), src, dest, cold
    )


def tar_timing(src: Path, dest: Path, cold: bool = True) -> Timing:
    """`tar -C src -cf - . | tar -C dest -xf -`: the classic streaming copy."""

    def pipe() -> None:
        dest.mkdir(parents=True)
        writer = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=writer.stdout, check=True)
        if writer.wait() != 0:
            raise StagingError(f"tar could not read {src}")

    return _copy_timing(pipe, src, dest, cold)


DD_STREAMS = 32


def parallel_dd(src: Path, dest: Path, streams: int = DD_STREAMS) -> None:
    """Copy every file of `src` into `dest` with one `dd bs=16M` per file, up to `streams` at
    once, reading with O_DIRECT where the source allows it: the leanest real copy a shell gives.
    Like `mlhpc stage` it reads each block into a buffer and writes it from there, without the
    hashing and the Python: what is left between a copy and the disks' limits."""
    paths = dataset.source_files(src)
    direct = ["iflag=direct"] if paths and _direct_reads_allowed(paths[0]) else []

    def one(path: Path) -> None:
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dd", f"if={path}", f"of={target}", "bs=16M", *direct, "status=none"], check=True)

    with ThreadPoolExecutor(max_workers=max(1, min(streams, len(paths)))) as pool:
        list(pool.map(one, paths))


def _direct_reads_allowed(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)))
    except OSError:
        return False
    return True


def dd_timing(src: Path, dest: Path, cold: bool = True) -> Timing:
    return _copy_timing(lambda: parallel_dd(src, dest), src, dest, cold)


def stage_timing(src: Path, dest: Path, cold: bool = True) -> Timing:
    """One rank's `stage_dataset` with its defaults, like `cp_timing`."""
    return _copy_timing(lambda: stage_dataset(StageRequest(src, dest)), src, dest, cold)


BASELINES = ("raw-write", "cp", "tar", "raw-read", "copy-limit")


def timings_by_round(
    src: Path,
    size: int,
    local_dir: Path,
    repeats: int,
    cold: bool = True,
    methods: Sequence[str] = BASELINES,
) -> dict[str, list[Timing]]:
    """The timing of each method in each of `repeats` rounds; the methods take turns within a
    round, so that all of them see the same state of a noisy disk (compare them round by round).

    `cp`, `tar`, `dd` (`parallel_dd`) and `mlhpc` (one rank, `stage_dataset`) copy `src` into
    `local_dir`, each on the user's clock (`user_clock`); `raw-read` reads `src`'s files with no software between them and the disk,
    `raw-write` writes `size` bytes to `local_dir`'s disk, and `copy-limit` does both at once.
    Raw writes come first in a round and raw reads after the copies: right after a large write
    the disk is still flushing it.

    The raw measures run at each of `RAW_DEPTHS` in every round and keep the depth with the lower
    median over the rounds, the disk's preferred depth. Not the faster run of each round: the
    faster of two noisy runs beats either on average, and would flatter the baselines. Their
    timings carry only `wall_s` (their own seconds, writes on disk): they stage nothing to read.
    """
    local_raw, dest = local_dir / "raw-write", local_dir / "dest"
    measures: dict[str, Callable[[int], Timing | float]] = {  # in the order they run within a round
        "raw-write": lambda depth: raw_write_seconds(local_raw, size, depth),
        "cp": lambda _: cp_timing(src, dest, cold),
        "tar": lambda _: tar_timing(src, dest, cold),
        "dd": lambda _: dd_timing(src, dest, cold),
        "mlhpc": lambda _: stage_timing(src, dest, cold),
        "raw-read": lambda depth: raw_read_seconds(src, cold, depth),
        "copy-limit": lambda depth: raw_copy_seconds(src, local_raw, cold, depth),
    }
    unknown = set(methods) - measures.keys()
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}")
    runs: dict[tuple[str, int], list[Timing]] = {
        (name, depth): [] for name in methods for depth in _depths(name)
    }
    for _ in range(repeats):
        for name, measure in measures.items():
            if name in methods:
                for depth in _depths(name):
                    got = measure(depth)
                    runs[name, depth].append(got if isinstance(got, Timing) else Timing(wall_s=got))
    return {
        name: min((runs[name, depth] for depth in _depths(name)), key=lambda t: median_timing(t).wall_s)
        for name in methods
    }


def _depths(method: str) -> tuple[int, ...]:
    """Requests in flight to try: the raw measures' `RAW_DEPTHS`; one run for the others."""
    return RAW_DEPTHS if method.startswith("raw-") or method == "copy-limit" else (0,)
