"""The distributed level: what data parallelism's gradient all-reduce costs. Real ranks on this
node join a real process group, train the workload under DistributedDataParallel, and a DDP
communication hook counts and times every bucket the all-reduce carries.

The ranks are plain subprocesses (`python -m mlhpc.characterize.communication`, as the staging
workers are): they do not re-run the caller's main module, and a hung rank is killed by the
caller after `timeout_s`, or by the kernel when the caller dies. The caller holds their store on
a port the kernel picks, as torchrun's agent does: no race with other jobs for a free port."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pickle
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlhpc.common.cluster.termination import die_with_parent
from mlhpc.common.errors import ConfigError, MlhpcError
from mlhpc.common.safeio.fileio import atomic_write_text

if TYPE_CHECKING:  # torch is imported where it runs: the ranks, the store
    from mlhpc.characterize.workload import Workload

WARMUP_STEPS = 2
"""Untimed steps first: DDP rebuilds its buckets in gradient order after the first."""
PHASES = 3
"""Timed phases of `steps` each: without all-reduce, overlapped as DDP runs, each collective awaited."""
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class CommLevel:
    """Rank 0's figures (medians over the timed steps), beside the analytic all-reduce volume."""

    backend: str
    world_size: int
    steps: int
    """Timed steps in each phase (after WARMUP_STEPS untimed ones)."""
    allreduce_bytes_per_step: int
    """Bytes of the bucket buffers handed to all-reduce in one step (measured by the hook)."""
    analytic_allreduce_bytes: int
    """The trainable parameters' bytes (`trainable_bytes` of the workload's model): the same
    number when DDP all-reduces every gradient once."""
    ring_bytes_sent_per_rank: float
    """2(n-1)/n × allreduce_bytes_per_step: what a ring all-reduce sends from each rank a step."""
    collectives_per_step: int
    """All-reduce calls (DDP buckets) in one step."""
    bucket_bytes: tuple[int, ...]
    """Each bucket's bytes, in the order DDP reduces them (gradients of the last layers first)."""
    step_s: float
    """Seconds per step as DDP runs it: all-reduce overlapped with the backward pass."""
    step_no_comm_s: float
    """Seconds per step with no all-reduce (DDP's no_sync): the compute alone."""
    step_serial_s: float
    """Seconds per step when each collective is awaited as it is launched (no overlap)."""
    comm_s: float
    """Seconds per step in all-reduce, each collective timed from launch to completion while the
    backward pass waits for it (on CUDA, synchronised on both sides)."""
    comm_share: float
    """Median over the serial steps of each one's collective seconds / its seconds: the fraction
    of a step spent all-reducing if nothing overlapped (0 to 1)."""
    exposed_comm_s: float
    """step_s - step_no_comm_s, at least 0: what all-reduce adds to a step despite the overlap."""
    algorithm_bandwidth_bytes_per_s: float | None
    """allreduce_bytes_per_step / comm_s (None if no time was measured)."""
    bus_bandwidth_bytes_per_s: float | None
    """ring_bytes_sent_per_rank / comm_s: comparable across world sizes (nccl-tests' busbw)."""
    rank_step_s: tuple[float, ...]
    """step_s of every rank, in rank order."""


def measure_communication(
    workload_factory: Callable[[int], Workload],
    *,
    steps: int,
    world_size: int = 2,
    backend: str = "gloo",
    timeout_s: float = 600.0,
) -> CommLevel:
    """Start `world_size` ranks on this node, each training `workload_factory(rank)` under DDP.

    The factory contract: a picklable top-level callable (a module-level function or a
    functools.partial of one; no lambda), importable in a fresh process; `factory(rank)` returns
    a Workload whose `batches` give at least WARMUP_STEPS + PHASES × steps batches (an endless
    iterator is simplest) and whose model holds the same parameters on every rank's device. Under
    nccl, rank r's CUDA device (r modulo the devices) is current when the factory runs: build on
    `torch.device("cuda")`. MlhpcError, one line, when a rank fails or `timeout_s` passes."""
    _check(steps, world_size, backend)
    try:
        factory = pickle.dumps(workload_factory)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ConfigError(
            f"workload_factory {workload_factory!r} cannot be sent to the ranks ({e}); "
            "pass a module-level function or a functools.partial of one"
        ) from e
    with tempfile.TemporaryDirectory(prefix="mlhpc-comm-") as folder, _job_store(timeout_s) as port:
        job = {"steps": steps, "world_size": world_size, "backend": backend, "port": port}
        job.update(folder=folder, timeout_s=timeout_s)
        ranks = [_start_rank(rank, job, factory) for rank in range(world_size)]
        try:
            _wait(ranks, Path(folder), timeout_s)
        finally:
            for proc in ranks:
                with contextlib.suppress(OSError):
                    proc.kill()
            for proc in ranks:
                proc.wait()
        results = [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(world_size)]
    return _level(results, steps, world_size, backend)


def _check(steps: int, world_size: int, backend: str) -> None:
    if steps < 1:
        raise ConfigError(f"steps={steps} must be at least 1; time at least one step")
    if world_size < 1:
        raise ConfigError(f"world_size={world_size} must be at least 1")
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} is unknown; use {' or '.join(BACKENDS)}")
    if backend == "nccl":
        import torch

        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if devices < world_size:
            raise ConfigError(
                f"backend=nccl needs a CUDA device per rank: {devices} for world_size={world_size}; "
                "use fewer ranks or backend=gloo"
            )


@contextlib.contextmanager
def _job_store(timeout_s: float) -> Iterator[int]:
    """The ranks' TCP store, held here for the block on 127.0.0.1 only and a port the kernel
    picks; yields the port. The socket is bound here and handed to the store, as
    common/cluster/liveness.host_store does, but without waiting for the ranks to join."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(socket.SOMAXCONN)
        port = int(sock.getsockname()[1])
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            None,
            True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    try:
        yield port
    finally:
        del store


def _start_rank(rank: int, job: dict[str, Any], factory: bytes) -> subprocess.Popen[bytes]:
    """Rank `rank`, fed its job on stdin: this process's sys.path first (the factory's module must
    import there as here), then the job. Output goes to a file, read back if the rank fails."""
    # join_group connects every rank, rank 0 too, to the store at MASTER_ADDR:MASTER_PORT when
    # TORCHELASTIC_USE_AGENT_STORE says an agent holds it (torchrun's way; here, the caller).
    env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job["port"]))
    # A collective outlasts the caller's deadline: the caller's one line names what hung, and an
    # orphaned rank (its caller gone without the kernel's help) still ends on its own.
    env["MLHPC_COLLECTIVE_TIMEOUT"] = str(round(job["timeout_s"]) + 60)
    with open(Path(job["folder"]) / f"rank{rank}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlhpc.characterize.communication", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the caller alone
        )
    assert proc.stdin is not None
    with proc.stdin:
        pickle.dump(sys.path, proc.stdin)
        pickle.dump({**job, "rank": rank, "factory": factory}, proc.stdin)
    return proc


def _wait(ranks: list[subprocess.Popen[bytes]], folder: Path, timeout_s: float) -> None:
    """Until every rank ended well; MlhpcError naming the first that failed, or those still
    running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [proc.poll() for proc in ranks]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank = failed[0]
            raise MlhpcError(f"communication level: rank {rank} failed: {_last_words(folder, rank)}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            running = ", ".join(str(r) for r, code in enumerate(codes) if code is None)
            raise MlhpcError(
                f"communication level: rank(s) {running} did not finish within {timeout_s:.0f} s "
                "(a hung collective or a slow step); raise timeout_s or lower steps"
            )
        time.sleep(0.05)


def _last_words(folder: Path, rank: int) -> str:
    """The error a rank reported, else the last line of its output."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads((folder / f"rank{rank}.json").read_text())["error"])
    lines = (folder / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "it ended without a word (killed?)"


def _level(results: list[dict[str, Any]], steps: int, world_size: int, backend: str) -> CommLevel:
    first = results[0]
    volume = first["allreduce_bytes_per_step"]
    ring = 2 * (world_size - 1) / world_size * volume
    comm_s = first["comm_s"]
    return CommLevel(
        backend=backend,
        world_size=world_size,
        steps=steps,
        allreduce_bytes_per_step=volume,
        analytic_allreduce_bytes=first["analytic_allreduce_bytes"],
        ring_bytes_sent_per_rank=ring,
        collectives_per_step=len(first["bucket_bytes"]),
        bucket_bytes=tuple(first["bucket_bytes"]),
        step_s=first["step_s"],
        step_no_comm_s=first["step_no_comm_s"],
        step_serial_s=first["step_serial_s"],
        comm_s=comm_s,
        comm_share=first["comm_share"],
        exposed_comm_s=max(0.0, first["step_s"] - first["step_no_comm_s"]),
        algorithm_bandwidth_bytes_per_s=volume / comm_s if comm_s > 0 else None,
        bus_bandwidth_bytes_per_s=ring / comm_s if comm_s > 0 else None,
        rank_step_s=tuple(result["step_s"] for result in results),
    )


# ---------------------------------------------------------------- one rank
class _Tally:
    """The DDP communication hook: the default all-reduce hook, its buckets counted and, when
    `serial`, each collective awaited and timed (then the backward pass waits for it)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.serial = False
        self.buckets: list[int] = []
        self.comm_s = 0.0

    def reset(self, serial: bool) -> None:
        self.serial, self.buckets, self.comm_s = serial, [], 0.0

    # No annotations on `bucket` and the result: DDP refuses a hook whose annotations are not
    # the classes themselves, and under `from __future__ import annotations` they are strings.
    def hook(self, group: Any, bucket):  # type: ignore[no-untyped-def]
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buffer = bucket.buffer()
        self.buckets.append(buffer.numel() * buffer.element_size())
        if not self.serial:
            return allreduce_hook(group, bucket)
        if self.cuda:  # the gradients' kernels first, so that only the collective is timed
            torch.cuda.synchronize()
        start = time.perf_counter()
        future = allreduce_hook(group, bucket)
        future.wait()
        if self.cuda:  # NCCL's future completes when its kernel is queued, not done
            torch.cuda.synchronize()
        self.comm_s += time.perf_counter() - start
        return future


def _timed_steps(workload: Workload, steps: int, tally: _Tally) -> tuple[list[float], list[float]]:
    """Each step's seconds, and the seconds the tally timed in its collectives during it."""
    times, comm = [], []
    for _ in range(steps):
        before = tally.comm_s
        start = time.perf_counter()
        workload.step()
        workload.synchronize()
        times.append(time.perf_counter() - start)
        comm.append(tally.comm_s - before)
    return times, comm


def _measure_rank(workload: Workload, job: dict[str, Any]) -> dict[str, Any]:
    """This rank's figures, its model wrapped as a run wraps it (DistContext.wrap_model)."""
    from mlhpc.characterize.workload import trainable_bytes
    from mlhpc.common.cluster.distributed import DistContext

    rank, world, steps = job["rank"], job["world_size"], job["steps"]
    ctx = DistContext(
        rank=rank,
        local_rank=rank,
        world_size=world,
        local_world_size=world,
        num_nodes=1,
        device=workload.device,
        backend=job["backend"],
        launcher="characterize",
    )
    analytic = trainable_bytes(workload.model)
    ddp = ctx.wrap_model(workload.model) if world > 1 else _ddp_of_one(workload)
    tally = _Tally(cuda=workload.device.type == "cuda")
    ddp.register_comm_hook(None, tally.hook)
    run = dataclasses.replace(workload, model=ddp)
    _timed_steps(run, WARMUP_STEPS, tally)
    with ddp.no_sync():
        no_comm, _ = _timed_steps(run, steps, tally)
    tally.reset(serial=False)
    overlapped, _ = _timed_steps(run, steps, tally)
    buckets = tally.buckets[: len(tally.buckets) // steps]
    tally.reset(serial=True)
    serial, comm = _timed_steps(run, steps, tally)
    return {
        "analytic_allreduce_bytes": analytic,
        "allreduce_bytes_per_step": sum(buckets),
        "bucket_bytes": buckets,
        "step_s": statistics.median(overlapped),
        "step_no_comm_s": statistics.median(no_comm),
        "step_serial_s": statistics.median(serial),
        "comm_s": statistics.median(comm),
        # Each step's own share: a step's collectives lie within it, so each share is at most 1.
        "comm_share": statistics.median([c / t for c, t in zip(comm, serial, strict=True)]),
    }


def _ddp_of_one(workload: Workload) -> Any:
    """DDP over a group of one (DistContext.wrap_model leaves a lone rank's model as it is):
    the hook still sees every bucket, and the collectives cost only their launch."""
    import torch

    device_ids = [workload.device.index] if workload.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(workload.model, device_ids=device_ids)



def _serve(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from mlhpc.common.cluster.group import join_group, shutdown_distributed
    from mlhpc.common.cluster.threads import configure_threads

    rank, world, backend = job["rank"], job["world_size"], job["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        configure_threads(ranks_on_node=world)
    join_group(backend, "127.0.0.1", job["port"], rank, world, world)
    try:
        workload = pickle.loads(job["factory"])(rank)
        if backend == "nccl" and workload.device.type != "cuda":
            raise ConfigError(f"backend=nccl but the workload is on {workload.device}; build it on cuda")
        if workload.device.type == "cuda" and workload.device.index is None:  # DDP needs the index
            workload = dataclasses.replace(workload, device=torch.device("cuda", torch.cuda.current_device()))
        result = _measure_rank(workload, job)
        dist.barrier()  # every rank past its last collective: none is left waiting on a peer that ended
        return result
    except BaseException:
        shutdown_distributed()
        raise


def main() -> None:
    """A rank: read sys.path and the job from stdin, measure, write rank<r>.json in the job's folder."""
    if len(sys.argv) > 1:
        die_with_parent(int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when a rank stops
    sys.path[:] = pickle.load(sys.stdin.buffer)
    job = pickle.load(sys.stdin.buffer)
    out = Path(job["folder"]) / f"rank{job['rank']}.json"
    try:
        result = _serve(job)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        out.write_text(json.dumps({"error": f"{type(e).__name__}: {first}"[:500]}))
        raise
    atomic_write_text(out, json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    # Out without the interpreter's teardown, the figures written: a daemon thread still inside a
    # torch call then (the heartbeat's, before common/cluster/liveness joined it at exit) aborted
    # the rank ("terminate called without an active exception"), and nothing is left to tear down.
    os._exit(0)


if __name__ == "__main__":
    main()
