"""The measurements behind the staging study: datasets, baselines, and timed staging runs.

Every timing starts from a cold source: its own pages evicted from the page cache before each
copy (`evict`, any user), and the whole cache dropped once per dataset by the caller as root
(`drop_caches`; never before each step: that costs the whole machine). Copies are timed on the user's
clock (`Timing`: the wall time without `sync`, then until every staged file has been read once,
and a sync-inclusive figure only as a labelled extra), for the baselines and `mlhpc stage` alike;
the raw disk measures use O_DIRECT and end when their writes are on disk.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import CallbackComm, Communicator
from mlhpc.staging.connect import make_comm
from mlhpc.staging.manifest import MANIFEST_NAME, build_manifest
from mlhpc.staging.request import StageRequest
from mlhpc.staging.sink import ALIGN, BufferPool, align_up
from mlhpc.staging.stage import stage_dataset

_BLOCK = 16 << 20


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


@dataclass(frozen=True, kw_only=True)
class Timing:
    """One copy on the user's clock, with the sync-inclusive time as a labelled extra."""

    wall_s: float
    """The command's wall time, as the user waits for it (no `sync`)."""
    read_once_s: float | None = None
    """`wall_s` plus reading every staged file once, as a first epoch does; None for the raw disk
    measures, which stage nothing."""
    extra_with_sync_s: float | None = None
    """Extra, not the user's clock: `wall_s` plus a `sync` until the copy is on disk (timed after
    the read); None for the raw disk measures."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Timing:
        """The timing a `run_plan` result row carries."""
        return cls(**{name: row.get(name) for name in TIMING_FIELDS})


TIMING_FIELDS = ("wall_s", "read_once_s", "extra_with_sync_s")


def read_all(root: Path) -> None:
    """Read every file under `root` once, as a first epoch does."""
    buffer = bytearray(1 << 20)
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb", buffering=0) as handle:
                while handle.readinto(buffer):
                    pass


def user_clock(copy: Callable[[], object], dest: Path) -> Timing:
    """Time `copy` as the user waits for it, then read `dest` once, then `sync` (the extra).

    `copy` may return its own seconds (ranks timed inside their launch), else it is timed here.
    """
    started = time.perf_counter()
    own = copy()
    copied = time.perf_counter()
    if isinstance(own, float):
        started = copied - own
    read_all(dest)
    read = time.perf_counter()
    os.sync()
    return Timing(
        wall_s=copied - started,
        read_once_s=read - started,
        extra_with_sync_s=copied - started + time.perf_counter() - read,
    )


def timed(action: Callable[[], object], cold_source: Path | None = None) -> float:
    """Seconds for `action` plus a `sync`: the raw disk measures, whose writes are O_DIRECT and
    fsynced, so that the sync finds nothing left of theirs to write. `cold_source` is evicted
    from the page cache first (for a file system that refuses O_DIRECT)."""
    if cold_source is not None:
        evict(cold_source)
    started = time.perf_counter()
    action()
    os.sync()
    return time.perf_counter() - started


def _fresh(path: Path) -> Path:
    """`path`, refused when something is there already: a measure removes only what it made."""
    if path.exists() or path.is_symlink():
        raise StagingError(f"{path} exists already; the study writes only where nothing is (move it away)")
    return path


def _copy_timing(copy: Callable[[], object], src: Path, dest: Path, cold: bool) -> Timing:
    """`user_clock(copy)` from a cold `src` into a `dest` that does not exist before (else refused)
    and is removed after: this call made it."""
    _fresh(dest)
    try:
        if cold:
            evict(src)
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
    paths = source_files(src)
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


RAW_STREAMS = 4
RAW_DEPTHS = (RAW_STREAMS, 32)
"""Requests in flight tried by the raw baselines, which keep the faster over the rounds
(`timings_by_round`). A single synchronous
stream leaves a virtual or parallel disk idle between requests, and which depth a disk likes
best differs (here 32 on 64 KiB files, 4 on 1 MiB ones); 32 is what `mlhpc stage` keeps in
flight by default, so no copy can win by keeping a deeper queue than its baseline."""

_read_buffers = BufferPool()


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


def source_files(src: Path) -> list[Path]:
    """The files a staging of `src` reads: the archive itself, or every file below the directory."""
    return [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())


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
    _fresh(directory)
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
    _fresh(write_dir)
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


def median_timing(timings: Sequence[Timing]) -> Timing:
    """Each figure's median over `timings` (a figure missing from any of them stays None)."""

    def median(values: list[float | None]) -> float | None:
        return None if None in values else statistics.median(v for v in values if v is not None)

    return Timing(
        wall_s=statistics.median(t.wall_s for t in timings),
        read_once_s=median([t.read_once_s for t in timings]),
        extra_with_sync_s=median([t.extra_with_sync_s for t in timings]),
    )


def medians(times: dict[str, list[Timing]]) -> dict[str, Timing]:
    return {name: median_timing(values) for name, values in times.items()}


def stage_timing(src: Path, dest: Path, cold: bool = True) -> Timing:
    """One rank's `stage_dataset` with its defaults, like `cp_timing`."""
    return _copy_timing(lambda: stage_dataset(StageRequest(src, dest)), src, dest, cold)


def memory_cgroup(name: str, limit_bytes: int) -> Path | None:
    """A new memory cgroup (v1 or v2) of `limit_bytes` under this process's own, or None where
    none can be made (not root, no memory controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            folder, limit = Path("/sys/fs/cgroup") / path.lstrip("/") / name, "memory.max"
        elif "memory" in controllers.split(","):
            folder, limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / name, "memory.limit_in_bytes"
        else:
            continue
        try:
            folder.mkdir()
            (folder / limit).write_text(f"{limit_bytes}\n")
            return folder
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def run_in_cgroup(group: Path, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run `command` inside `group` (its pid joins before it starts), output captured."""

    def join() -> None:
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")

    proc = subprocess.run(list(command), capture_output=True, text=True, preexec_fn=join)
    if proc.returncode:
        raise StagingError(f"{command[0]} failed in {group}: {proc.stderr.strip()[-300:]}")
    return proc


def remove_cgroup(group: Path) -> None:
    with contextlib.suppress(OSError):
        group.rmdir()


def run_plan(comm: Communicator, plan: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timed `stage_dataset` runs, one per plan row, on every rank together; rank 0's results.

    Each rank stages into `<dest>/node<N>`, standing in for one node's local disk. A result holds
    the row's `Timing` fields: `wall_s` from the first barrier to the one after staging (the
    source's pages evicted before it when the row says `"cold"`); unless the
    row says `"read": false`, `read_once_s` until every rank has read its node's copy once; unless
    it says `"sync": false`, `extra_with_sync_s`, `wall_s` plus rank 0's `sync` (after the read).
    """
    results = []
    for row in plan:
        dest = _fresh(Path(row["dest"]) / f"node{comm.topology.node}")
        if comm.rank == 0 and row["cold"]:
            evict(Path(row["src"]))
        comm.barrier()
        started = time.perf_counter()
        report = stage_dataset(
            StageRequest(
                Path(row["src"]),
                dest,
                mode=row["mode"],
                workers=row["workers"],
                processes=row.get("processes"),
            ),
            comm,
        )
        comm.barrier()
        wall = time.perf_counter() - started
        read_once = with_sync = None
        if row.get("read", True):
            read_all(dest)
            comm.barrier()
            read_once = time.perf_counter() - started
        if row.get("sync", True):
            syncing = time.perf_counter()
            if comm.rank == 0:
                os.sync()
            comm.barrier()
            with_sync = wall + time.perf_counter() - syncing
        timing = Timing(wall_s=wall, read_once_s=read_once, extra_with_sync_s=with_sync)
        results.append({**row, **asdict(timing), "job_read_bytes": report.job_read_bytes})
        if not row.get("keep", False):
            shutil.rmtree(dest, ignore_errors=True)
    return results


def run_plan_in_ranks(
    plan: Sequence[dict[str, Any]], ranks: int, work: Path, comm: str = "torch"
) -> list[dict[str, Any]]:
    """Run `plan` in `ranks` local processes, each its own node (one launch for the whole plan)."""
    if ranks == 1:
        return run_plan(CallbackComm(), plan)
    # Fresh names made here, removed here: nothing of anyone else's in `work` is written or removed.
    plan_fd, plan_name = tempfile.mkstemp(prefix=f"plan-{ranks}-", suffix=".json", dir=work)
    result_fd, result_name = tempfile.mkstemp(prefix=f"results-{ranks}-", suffix=".json", dir=work)
    os.close(result_fd)
    plan_path, result_path = Path(plan_name), Path(result_name)
    try:
        with os.fdopen(plan_fd, "w") as handle:
            handle.write(json.dumps(list(plan)))
        return _launch_group(plan_path, result_path, ranks, comm)
    finally:
        plan_path.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)


def _launch_group(plan_path: Path, result_path: Path, ranks: int, comm: str) -> list[dict[str, Any]]:
    """Launch the `ranks` processes on `plan_path`; their rank 0 writes `result_path`."""
    module = ["-m", "mlhpc.staging.study.tools", str(plan_path), str(result_path), comm]
    if comm == "mpi":
        launcher = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), sys.executable]
    else:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
        ]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
    }
    proc = subprocess.run([*launcher, *module], capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not result_path.stat().st_size:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise StagingError(f"the {ranks}-rank staging group failed: {' | '.join(tail)}")
    return json.loads(result_path.read_text())


def _group_main(plan_path: str, result_path: str, kind: str) -> None:
    """Entry of each rank process launched by `run_plan_in_ranks`."""
    comm = make_comm(kind if kind == "mpi" else "torch", each_rank_a_node=True)
    try:
        results = run_plan(comm, json.loads(Path(plan_path).read_text()))
        if comm.rank == 0:
            Path(result_path).write_text(json.dumps(results))
    finally:
        comm.close()


if __name__ == "__main__":
    _group_main(*sys.argv[1:4])
