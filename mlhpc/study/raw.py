"""The disks without software: O_DIRECT reads of the source, O_DIRECT writes of random bytes to
the node-local disk, and both at once (what the disks give a copy); each ends when its writes
are on disk."""

from __future__ import annotations

import functools
import mmap
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlhpc.staging.exchange import BufferPool
from mlhpc.study.clock import timed
from mlhpc.study.dataset import fresh_path, source_files

_BLOCK = 16 << 20

RAW_STREAMS = 4
RAW_DEPTHS = (RAW_STREAMS, 32)
"""Requests in flight tried by the raw baselines, which keep the faster over the rounds
(`timings_by_round`). A single synchronous
stream leaves a virtual or parallel disk idle between requests, and which depth a disk likes
best differs (here 32 on 64 KiB files, 4 on 1 MiB ones); 32 is what `mlhpc stage` keeps in
flight by default, so no copy can win by keeping a deeper queue than its baseline."""


_read_buffers = BufferPool()  # page-aligned (mmap), as O_DIRECT wants
ALIGN = 4096


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@functools.cache
def _random_block() -> memoryview:
    """16 MiB of random bytes, page-aligned, made once and only read (by concurrent raw writes):
    a disk that compresses or skips zeros must not look faster than it is."""
    block = mmap.mmap(-1, _BLOCK)
    block.write(os.urandom(_BLOCK))
    return memoryview(block)


def _parts(total_bytes: int, streams: int) -> list[tuple[int, int]]:
    """(offset, length) of `streams` contiguous parts, whole 16 MiB blocks each (the last may be short)."""
    blocks = max(1, -(-total_bytes // _BLOCK))
    per = -(-blocks // max(1, streams))
    return [
        (start * _BLOCK, min(total_bytes, (start + per) * _BLOCK) - start * _BLOCK)
        for start in range(0, blocks, per)
    ]


def _open_direct(path: Path, flags: int) -> int:
    """O_DIRECT where the file system allows it (not tmpfs on older kernels), else buffered."""
    try:
        return os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        return os.open(path, flags, 0o644)


def _read_pieces(paths: Sequence[Path], streams: int) -> list[tuple[Path, int, int]]:
    """Whole files, or with fewer files than streams each file cut into parts, so that `streams`
    requests can be in flight."""
    per_file = max(1, -(-streams // max(1, len(paths))))
    return [(path, *part) for path in paths for part in _parts(path.stat().st_size, per_file)]


def _read_piece(piece: tuple[Path, int, int]) -> None:
    path, offset, length = piece
    buffer = _read_buffers.get(_BLOCK)  # reused: fresh pages would cost a fault each
    view = memoryview(buffer)
    fd = _open_direct(path, os.O_RDONLY)
    try:
        for at in range(offset, offset + length, _BLOCK):
            os.preadv(fd, [view[: align_up(min(_BLOCK, offset + length - at))]], at)  # O_DIRECT: whole pages
    finally:
        os.close(fd)
        view.release()
        _read_buffers.put(buffer)


def _raw_read(paths: Sequence[Path], streams: int) -> None:
    with ThreadPoolExecutor(max_workers=streams) as pool:
        list(pool.map(_read_piece, _read_pieces(paths, streams)))


def _write_file(path: Path, length: int) -> None:
    view = _random_block()
    fd = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for at in range(0, length, _BLOCK):
            os.pwrite(fd, view[: min(_BLOCK, length - at)], at)
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_write(directory: Path, total_bytes: int, streams: int) -> None:
    """`total_bytes` in `streams` files written at once: one file each, because concurrent O_DIRECT
    writes into one new file wait for each other's block allocation (a copy writes many files)."""
    directory.mkdir(parents=True, exist_ok=True)
    lengths = [length for _, length in _parts(total_bytes - total_bytes % ALIGN or ALIGN, streams)]
    with ThreadPoolExecutor(max_workers=len(lengths)) as pool:
        list(pool.map(lambda i: _write_file(directory / f"part{i}.bin", lengths[i]), range(len(lengths))))


def raw_write_seconds(directory: Path, total_bytes: int, streams: int = RAW_STREAMS) -> float:
    """O_DIRECT writes of 16 MiB into `streams` new files in `directory` at once, each fsynced: the
    disk's write speed without the page cache. The directory must not exist before (else refused)
    and is removed afterwards."""
    fresh_path(directory)
    _random_block()
    try:
        started = time.perf_counter()
        _raw_write(directory, total_bytes, streams)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def raw_read_seconds(src: Path, cold: bool = True, streams: int = RAW_STREAMS) -> float:
    """O_DIRECT reads of the source's own files (in their own layout on disk), in 16 MiB blocks,
    `streams` at once: what the disk gives, without software or the page cache (whose page
    allocations cost more than the disk in some VMs)."""
    paths = source_files(src)
    return timed(lambda: _raw_read(paths, streams), src if cold else None)


def raw_copy_seconds(src: Path, write_dir: Path, cold: bool = True, streams: int = RAW_STREAMS) -> float:
    """The raw read of `src` and a raw write of as many bytes into `write_dir`, at the same time.

    Every copy reads and writes each byte, so this is what the disks give a copy: on two devices
    about the slower of raw read and raw write; when source and destination share a disk, reads
    and writes share its bandwidth and it is lower than both.
    """
    paths = source_files(src)
    size = sum(path.stat().st_size for path in paths)
    fresh_path(write_dir)
    _random_block()

    def both() -> None:
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = [
                pool.submit(_raw_read, paths, streams),
                pool.submit(_raw_write, write_dir, size, streams),
            ]
            for job in jobs:
                job.result()

    try:
        return timed(both, src if cold else None)
    finally:
        shutil.rmtree(write_dir, ignore_errors=True)
