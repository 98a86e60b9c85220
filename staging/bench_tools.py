"""The measurements behind the staging study: datasets, baselines, and timed staging runs.

Every timing starts from a cold page cache when run as root, and ends when the data is on
disk (`sync`), for the baselines and for `mlhpc stage` alike.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import CallbackComm, Communicator, make_comm
from mlhpc.staging.manifest import MANIFEST_NAME, build_manifest
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


def make_dataset(root: Path, total_bytes: int, file_bytes: int) -> int:
    """Files of `file_bytes` (incompressible) adding up to about `total_bytes`, with a manifest,
    in folders of 1,000 as real datasets are laid out. Returns the file count."""
    count = max(1, total_bytes // file_bytes)
    if (root / MANIFEST_NAME).is_file():
        return count
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


def timed(action: Callable[[], object], cold: bool = True) -> float:
    """Seconds for `action` plus the `sync` that puts its writes on disk."""
    if cold and drop_caches():
        time.sleep(SETTLE_S)
    started = time.perf_counter()
    action()
    os.sync()
    return time.perf_counter() - started


def cp_seconds(src: Path, dest: Path, cold: bool = True) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    seconds = timed(lambda: subprocess.run(["cp", "-r", str(src), str(dest)], check=True), cold)
    shutil.rmtree(dest, ignore_errors=True)
    return seconds


def tar_seconds(src: Path, dest: Path, cold: bool = True) -> float:
    """`tar -C src -cf - . | tar -C dest -xf -`: the classic streaming copy."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)

    def pipe() -> None:
        writer = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=writer.stdout, check=True)
        if writer.wait() != 0:
            raise StagingError(f"tar could not read {src}")

    seconds = timed(pipe, cold)
    shutil.rmtree(dest, ignore_errors=True)
    return seconds


def raw_write_seconds(path: Path, total_bytes: int) -> float:
    """Sequential O_DIRECT writes of 16 MiB and an fsync (through the page cache where O_DIRECT
    is refused)."""
    buffer = mmap.mmap(-1, _BLOCK)
    buffer.write(os.urandom(_BLOCK))
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        fd = os.open(path, flags, 0o644)
    try:
        started = time.perf_counter()
        for offset in range(0, total_bytes - total_bytes % _BLOCK or _BLOCK, _BLOCK):
            os.pwrite(fd, buffer, offset)
        os.fsync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)


def raw_read_seconds(path: Path, cold: bool = True) -> float:
    """Sequential O_DIRECT reads of 16 MiB into one buffer: what the disk gives, without the page
    cache (whose page allocations cost more than the disk in some VMs)."""
    buffer = memoryview(mmap.mmap(-1, _BLOCK))

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        except OSError:
            fd = os.open(path, os.O_RDONLY)
        try:
            while os.readv(fd, [buffer]):
                pass
        finally:
            os.close(fd)

    return timed(read, cold)


def run_plan(comm: Communicator, plan: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timed `stage_dataset` runs, one per plan row, on every rank together; rank 0's results.

    Each rank stages into `<dest>/node<N>`, standing in for one node's local disk.
    """
    results = []
    for row in plan:
        dest = Path(row["dest"]) / f"node{comm.topology.node}"
        shutil.rmtree(dest, ignore_errors=True)
        comm.barrier()
        if comm.rank == 0 and row["cold"] and drop_caches():
            time.sleep(SETTLE_S)
        comm.barrier()
        started = time.perf_counter()
        report = stage_dataset(
            Path(row["src"]),
            dest,
            comm=comm,
            mode=row["mode"],
            workers=row["workers"],
            processes=row.get("processes"),
        )
        comm.barrier()
        if comm.rank == 0:
            os.sync()
        comm.barrier()
        seconds = time.perf_counter() - started
        results.append({**row, "seconds": seconds, "job_read_bytes": report.job_read_bytes})
        shutil.rmtree(dest, ignore_errors=True)
    return results


def run_plan_in_ranks(
    plan: Sequence[dict[str, Any]], ranks: int, work: Path, comm: str = "torch"
) -> list[dict[str, Any]]:
    """Run `plan` in `ranks` local processes, each its own node (one launch for the whole plan)."""
    if ranks == 1:
        return run_plan(CallbackComm(), plan)
    plan_path, result_path = work / f"plan-{ranks}.json", work / f"results-{ranks}.json"
    plan_path.write_text(json.dumps(list(plan)))
    result_path.unlink(missing_ok=True)
    module = ["-m", "mlhpc.staging.bench_tools", str(plan_path), str(result_path), comm]
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
    if proc.returncode != 0 or not result_path.is_file():
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
