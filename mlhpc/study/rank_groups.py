"""Timed `stage_dataset` runs on a group of local rank processes, each standing in for a node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlhpc.common.errors import StagingError
from mlhpc.staging.comm import CallbackComm, Communicator
from mlhpc.staging.connect import make_comm
from mlhpc.staging.request import StageRequest
from mlhpc.staging.stage import stage_dataset
from mlhpc.study import dataset
from mlhpc.study.clock import Timing


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
        dest = dataset.fresh_path(Path(row["dest"]) / f"node{comm.topology.node}")
        if comm.rank == 0 and row["cold"]:
            dataset.evict(Path(row["src"]))
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
            dataset.read_all(dest)
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
    module = ["-m", "mlhpc.study.rank_groups", str(plan_path), str(result_path), comm]
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
