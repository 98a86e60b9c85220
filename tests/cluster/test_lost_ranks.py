"""A collective that loses a rank ends every other rank in a bounded time with one line that
names the lost rank's node (common/cluster/liveness.py, common/cluster/distributed.py): three real gloo ranks
on this machine, one of them killed (its sockets close at once), stopped with SIGSTOP (it
answers nothing, like a node whose link went down: the others wait out the collective
timeout), or rank 0 killed (the job's store goes with it). The multi-node versions run on the
virtual cluster in tests/cluster/test_cluster_faults.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.common.cluster.group import collective_reason, collective_timeout
from mlhpc.common.cluster.liveness import HOST_WAIT_S, LISTEN_S, STORE_TIMEOUT_S
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import cli_env

TIMEOUT_S = 3
LOOK_BOUND_S = LISTEN_S + 2 * STORE_TIMEOUT_S + HOST_WAIT_S
"""The most a rank's look at the others may take (liveness.Heartbeat.silence)."""
EXIT_S = 8.0
"""Destroying the group and leaving Python, on this busy 2-core machine."""

RANKS = """
import json, os, signal, sys, time
import torch
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import lost_rank_named, shutdown_distributed
from mlhpc.common.errors import MlhpcError

out, fault, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = init_distributed("gloo", "cpu")
record = {"rank": ctx.rank}
tensor = torch.ones(1)
try:
    with lost_rank_named(ctx, "FIX"):
        for step in range(1_000_000):
            if step == 50 and ctx.rank == victim:
                with open(f"{out}/fault", "w") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            ctx.all_reduce_sum(tensor)
except MlhpcError as e:
    record |= {"error": str(e), "at": time.time()}
finally:
    shutdown_distributed()
with open(f"{out}/rank{ctx.rank}.json", "w") as f:
    json.dump(record, f)
"""


def run_ranks(tmp_path: Path, fault: str, victim: int) -> tuple[float, dict[int, dict]]:
    """Three ranks started side by side (as srun starts them); the victim kills or stops itself
    at step 50. Returns when the fault happened and each surviving rank's record."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), fault, str(victim)],
            env=cli_env(
                RANK=str(r),
                WORLD_SIZE="3",
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE="3",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                MLHPC_COLLECTIVE_TIMEOUT=str(TIMEOUT_S),
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(3)
    ]
    try:
        errors = {r: rank.communicate(timeout=180)[1] for r, rank in enumerate(ranks) if r != victim}
    finally:
        for rank in ranks:  # the stopped one: SIGKILL ends a stopped process too
            if rank.poll() is None:
                rank.kill()
                rank.wait(timeout=30)
    for r, err in errors.items():
        assert "Traceback" not in err, (r, err)
    records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in errors}
    return float((tmp_path / "fault").read_text()), records


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("fault", "victim", "detect_s"),
    [("kill", 2, 0.0), ("stop", 2, TIMEOUT_S), ("kill", 0, 0.0)],
    ids=["rank-2-killed", "rank-2-stopped", "rank-0-killed"],
)
def test_every_other_rank_stops_in_time_naming_the_lost_node(
    tmp_path: Path, fault: str, victim: int, detect_s: float
) -> None:
    """Bound: the collective's failure (at once for a closed socket, the collective timeout for
    a silent rank) + the look at the others + leaving."""
    fault_at, records = run_ranks(tmp_path, fault, victim)
    host = socket.gethostname()
    for rank, record in records.items():
        error = record.get("error", "")
        assert error.startswith(f"rank {rank} on {host}: a collective failed ("), record
        assert error.endswith("; FIX") and "\n" not in error, error
        if victim == 0:  # the store went with rank 0
            assert "(rank 0" in error and ("closed" in error or "cannot be reached" in error), error
        else:
            assert f"{host} (rank {victim}) stopped answering" in error, error
        print(f"rank {rank}: stopped {record['at'] - fault_at:.1f} s after the fault: {error}")
        assert record["at"] - fault_at < detect_s + LOOK_BOUND_S + EXIT_S, (record["at"] - fault_at, error)


def test_the_collective_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHPC_COLLECTIVE_TIMEOUT", raising=False)
    assert collective_timeout().total_seconds() == 600
    monkeypatch.setenv("MLHPC_COLLECTIVE_TIMEOUT", "12.5")
    assert collective_timeout().total_seconds() == 12.5
    for bad in ("0", "-3", "nan", "inf", "ten", "1e9"):
        monkeypatch.setenv("MLHPC_COLLECTIVE_TIMEOUT", bad)
        with pytest.raises(ConfigError, match=rf"MLHPC_COLLECTIVE_TIMEOUT='{bad}' is not a number of seconds"):
            collective_timeout()


def test_a_gloo_error_becomes_a_short_reason() -> None:
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
        "[10.213.2.2]:153: Connection reset by peer. This is typically caused by a remote worker "
        "hanging or bugs in the application. GLHF!"
    )
    assert collective_reason(gloo) == "Read error [10.213.2.2]:153: Connection reset by peer"
    assert collective_reason(RuntimeError("")) == "RuntimeError"



# A rank that ends without shutdown_distributed. The check runs at exit after the heartbeat's own
# (atexit runs its hooks last registered first), before the interpreter is torn down.
EXIT_WITHOUT_SHUTDOWN = """
import atexit, datetime, threading, time
import torch.distributed as dist
from mlhpc.common.cluster import liveness

def beating_at_teardown():
    alive = [t.name for t in threading.enumerate() if t.name == "mlhpc-heartbeat" and t.is_alive()]
    print("beating at teardown:", alive, flush=True)

atexit.register(beating_at_teardown)
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
beat = liveness.Heartbeat(store, 0, hosts_store=True)
time.sleep(liveness.BEAT_S * 1.5)
"""


def test_the_heartbeat_ends_before_the_interpreter_does(tmp_path: Path) -> None:
    """A daemon thread still inside a torch call when the interpreter is torn down is unwound
    through torch's C++, which aborts the process after its work was done ("terminate called
    without an active exception", exit -6): 1 two-rank torchrun run in 7 here, each time with the
    heartbeat thread alive at exit. The heartbeat now stops and joins its thread at exit."""
    script = tmp_path / "exit_without_shutdown.py"
    script.write_text(EXIT_WITHOUT_SHUTDOWN)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=cli_env()
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "beating at teardown: []" in proc.stdout, proc.stdout + proc.stderr[-2000:]
