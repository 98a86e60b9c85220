"""Faults on the virtual cluster (scripts/vcluster), each with the bound every rank stops in:
a node's link cut mid-staging, a node's processes killed mid-training, a node's /local full,
a link that drops for two seconds, one slow link.

What each test holds: every rank stops within a bound worked out from mlhpc's own timeouts
(stated below, measured against the wall clock); each surviving rank prints one line naming
the lost node and what to do, and no traceback; nothing is marked staged (no marker, `mlhpc
verify` refuses) or successful (no result log) that is not; after the fault is undone, a rerun
or `--resume` completes; no mlhpc process of the test is left on a node, no lock is still held,
and Slurm runs no job of ours.

These tests change links, rates and a /local's size, so they run on a cluster of their own
(module scope: 4 nodes, node04's /local a 16 MiB tmpfs), never on the session's shared one.
Every client runs inside the cluster (`vcluster exec login -- srun ...`), never from the host's
own network namespace. The kernel here has no netem: a slow link is a slow rate (tbf), not an
added delay.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mlhpc.common.cluster.liveness import LISTEN_S, STORE_TIMEOUT_S
from scripts.vclusterlib.client import VCLUSTER, run_vcluster
from tests.helpers.cli import cli_env
from tests.helpers.datasets import dataset_files
from tests.helpers.processes import wait_for
from tests.helpers.vcluster_fixture import (
    VCluster,
    own_cluster,
)

pytestmark = pytest.mark.cluster

TIMEOUT_S = 10
"""MLHPC_COLLECTIVE_TIMEOUT for these runs: a collective that waits this long fails."""
DROP_TIMEOUT_S = 30
"""MLHPC_COLLECTIVE_TIMEOUT for the 2-s drop: after it TCP's backoff resends only at its next
doubling (up to ~5 s after the drop began), and the round then still carries its megabytes at
the shaped rate; on a loaded CI machine that came to 10 s once (every rank timed out), so the
drop test keeps a timeout well above it and tests the drop, not the timeout."""
LOOK_S = LISTEN_S + 2 * STORE_TIMEOUT_S
"""The most a rank's look at who still answers takes (liveness.Heartbeat.silence; rank 0 may
wait HOST_WAIT_S more for the others' looks, but only for ranks that still answer)."""
EXIT_S = 10.0
"""Leaving: destroying the group and Python's exit, on this busy 2-core machine."""
LOST_LINK_BOUND_S = TIMEOUT_S + LOOK_S + 10.0 + EXIT_S
"""A node's link cut: every rank stops within this many seconds (43.5): the collective times
out, the rank looks, rank 0 waits for the others' looks (HOST_WAIT_S, 10), it leaves."""
KILLED_BOUND_S = LOOK_S + 10.0 + EXIT_S
"""A node's processes killed: its peers' sockets close at once, so no collective timeout (33.5)."""
RATE_MBIT = 16
"""Every node link's rate in the staging tests: a 12 MiB replicate takes seconds, not a blink."""
FILES, FILE_BYTES = 12, 1 << 20
STAGED_MARKER = ".mlhpc_staged.json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[VCluster]:
    """A 4-node cluster of this module's own (node04's /local is a 16 MiB tmpfs)."""
    with own_cluster(f"pf{os.getpid()}", "--nodes", "4", "--small-local", "node04:16M") as made:
        yield made


@pytest.fixture(scope="module")
def dataset(cluster: VCluster) -> Path:
    """12 files of 1 MiB with their manifest, in the folder every host sees."""
    root = cluster.shared / "data"
    root.mkdir()
    for i in range(FILES):
        (root / f"f{i:02d}.bin").write_bytes(os.urandom(FILE_BYTES))
    subprocess.run(["mlhpc", "manifest", str(root)], check=True, capture_output=True, env=cli_env())
    return root


@pytest.fixture
def work(cluster: VCluster) -> Path:
    """This test's folder, seen by every host (a node's /tmp, hence tmp_path, is its own)."""
    folder = cluster.shared / f"work-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


@pytest.fixture
def dest(cluster: VCluster) -> Iterator[str]:
    """A fresh /local/<name> on every node, removed after the test."""
    name = f"fault-{uuid.uuid4().hex[:8]}"
    yield f"/local/{name}"
    for node in cluster.nodes:
        cluster.exec(node, ["rm", "-rf", f"/local/{name}"], check=False)


# ---------------------------------------------------------------- helpers


def node_pids(cluster: VCluster) -> dict[str, int]:
    return {n["name"]: n["pid"] for n in cluster.status()["nodes"]}


def node_root(cluster: VCluster, node: str) -> Path:
    """The node's file system as the node sees it (its /local included, a tmpfs too)."""
    return Path(f"/proc/{node_pids(cluster)[node]}/root")


def set_rates(cluster: VCluster, rates: dict[str, int | None]) -> None:
    """Shape each node's link to its rate in Mbit/s (None: unshaped)."""
    for node, rate in rates.items():
        shape = ["--rate", f"{rate}mbit"] if rate else ["--clear"]
        proc = run_vcluster("shape", "--name", cluster.name, node, *shape)
        assert proc.returncode == 0, proc.stderr


def link(cluster: VCluster, node: str, state: str) -> None:
    proc = run_vcluster("link", "--name", cluster.name, node, state)
    assert proc.returncode == 0, proc.stderr


def srun(
    cluster: VCluster, nodes: list[str], argv: list[str], out: Path, timeout_s: int = TIMEOUT_S
) -> subprocess.Popen[str]:
    """`srun` of argv on `nodes` (one task each), started from login; each node's stdout and
    stderr go to out/<node>.out and .err, written there by the node itself (so a node whose link
    is down still leaves its lines)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        "srun", "-N", str(len(nodes)), "-w", ",".join(nodes), "--ntasks-per-node=1",
        "-o", f"{out}/%N.out", "-e", f"{out}/%N.err", *argv,
    ]  # fmt: skip
    return subprocess.Popen(
        [str(VCLUSTER), "exec", "--name", cluster.name, "login", "--", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(OMP_NUM_THREADS="1", MLHPC_COLLECTIVE_TIMEOUT=str(timeout_s)),
    )


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def mine(cluster: VCluster, needle: str) -> dict[str, list[int]]:
    """The processes on each node whose command line holds `needle` (this test's path)."""
    uts = {os.readlink(f"/proc/{pid}/ns/uts"): node for node, pid in node_pids(cluster).items()}
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle.encode() not in (entry / "cmdline").read_bytes():
                continue
            node = uts.get(os.readlink(entry / "ns" / "uts"))
        except OSError:
            continue
        if node is not None:
            found.setdefault(node, []).append(int(entry.name))
    return found


def stop_times(cluster: VCluster, needle: str, since: float, bound: float) -> dict[str, float]:
    """Seconds after `since` (monotonic) at which each node's last process holding `needle`
    ended; waits at most `bound` + 5 s, then reports the nodes still running as infinity."""
    running = set(mine(cluster, needle))
    stopped: dict[str, float] = {}
    while running and time.monotonic() - since < bound + 5:
        time.sleep(0.2)
        now = set(mine(cluster, needle))
        for node in running - now:
            stopped[node] = time.monotonic() - since
        running &= now
    return stopped | {node: float("inf") for node in running}


def error_lines(out: Path) -> dict[str, list[str]]:
    """Each node's mlhpc error lines (torch's own [W ...] warnings left out)."""
    return {
        p.stem: [line for line in p.read_text().splitlines() if line.startswith("mlhpc:")]
        for p in sorted(out.glob("*.err"))
    }


def text_of(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "frame #" not in text, text[-3000:]


def held_locks(folder: Path) -> list[Path]:
    """The mlhpc lock files under `folder` that some process still holds (the files themselves
    stay by design: common/safeio/locks.py)."""
    held = []
    for lock in folder.rglob(".mlhpc.lock"):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                held.append(lock)
        finally:
            os.close(fd)
    return held


def slurm_idle(cluster: VCluster) -> None:
    """No job of ours left in Slurm, and every node back in service (a node that lost its link
    is DOWN until told: `scontrol update NodeName=... State=RESUME`, what an admin does)."""

    def settled() -> bool:
        jobs = cluster.exec("login", ["squeue", "-h", "-o", "%i %T"]).stdout.strip()
        states = cluster.exec("login", ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
        down = [line.split()[0] for line in states if line.strip() and "down" in line]
        for node in down:
            cluster.exec("login", ["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        return not jobs and not down

    wait_for(settled, "Slurm to run no job and every node to be up", 90, interval=0.1)


def nothing_left(cluster: VCluster, needle: str, folders: list[Path]) -> None:
    assert mine(cluster, needle) == {}, mine(cluster, needle)
    for folder in folders:
        assert held_locks(folder) == [], folder
    slurm_idle(cluster)


def stage_argv(src: Path, dest: str) -> list[str]:
    return ["mlhpc", "stage", str(src), dest, "--mode", "replicate", "--chunk-mib", "1"]


def staged_everywhere(cluster: VCluster, dest: str, src: Path) -> None:
    """`mlhpc verify DEST` passes on every node and each node holds the source's files."""
    for node in cluster.nodes:
        proc = cluster.exec(node, ["mlhpc", "verify", dest])
        assert f"{FILES} files verified" in proc.stdout, (node, proc.stdout)
        assert dataset_files(node_root(cluster, node) / dest.lstrip("/")) == dataset_files(src), node


def staged_nowhere(cluster: VCluster, dest: str) -> None:
    for node in cluster.nodes:
        assert not (node_root(cluster, node) / dest.lstrip("/") / STAGED_MARKER).exists(), node
        proc = cluster.exec(node, ["mlhpc", "verify", dest], check=False)
        assert proc.returncode == 2 and "holds no complete staged dataset" in proc.stderr, (node, proc.stderr)


def staging_started(cluster: VCluster, dest: str, job: subprocess.Popen[str]) -> Callable[[], bool]:
    """Whether node01 has begun to stage into dest (its run file is there); fails at once with
    the job's output if the job ended first."""
    marker = node_root(cluster, "node01") / dest.lstrip("/") / ".mlhpc_staging"

    def started() -> bool:
        if job.poll() is not None:
            raise AssertionError(f"the job ended before staging began: {finish(job)}")
        return marker.exists()

    return started


# ---------------------------------------------------------------- the faults


def test_a_link_cut_mid_staging_stops_every_rank_naming_the_node(
    cluster: VCluster, dataset: Path, dest: str, work: Path
) -> None:
    """node03's link goes down while `srun -N 4 mlhpc stage --mode replicate` runs. Expected:
    the all-gather round waits MLHPC_COLLECTIVE_TIMEOUT, fails, and every rank looks who still
    answers: the three others name node03, node03 names node01 (the rendezvous it cannot reach).
    Bound: LOST_LINK_BOUND_S (43.5 s) after the cut, for every rank, node03's included."""
    set_rates(cluster, dict.fromkeys(cluster.nodes, RATE_MBIT))
    out = work / "out"
    job = srun(cluster, list(cluster.nodes), stage_argv(dataset, dest), out)
    try:
        wait_for(staging_started(cluster, dest, job), "staging to begin", 90, interval=0.1)
        time.sleep(0.5)
        assert job.poll() is None, finish(job)
        cut = time.monotonic()
        link(cluster, "node03", "down")
        try:
            stopped = stop_times(cluster, dest, cut, LOST_LINK_BOUND_S)
        finally:
            link(cluster, "node03", "up")
        code, text = finish(job)
    finally:
        if job.poll() is None:
            job.kill()
    print(f"link cut: ranks stopped after {stopped} s (bound {LOST_LINK_BOUND_S} s)")
    assert set(stopped) == set(cluster.nodes) and max(stopped.values()) <= LOST_LINK_BOUND_S, stopped
    assert code != 0
    lines = error_lines(out)
    print("link cut:", lines)
    no_traceback(text, *(p.read_text() for p in out.iterdir()))
    for node in ("node01", "node02", "node04"):
        assert len(lines[node]) == 1, lines
        assert lines[node][0].startswith(f"mlhpc: error: rank {int(node[-2:]) - 1} on {node}: "), lines[node]
        assert "node03 (rank 2) stopped answering" in lines[node][0], lines[node]
        assert "check node03" in lines[node][0] and "rerun to resume" in lines[node][0], lines[node]
    assert len(lines["node03"]) == 1 and "node01 (rank 0" in lines["node03"][0], lines  # its rendezvous
    staged_nowhere(cluster, dest)
    nothing_left(cluster, dest, [node_root(cluster, n) / dest.lstrip("/") for n in cluster.nodes])
    # the link is back: the same command completes
    code, text = finish(srun(cluster, list(cluster.nodes), stage_argv(dataset, dest), work / "rerun"))
    assert code == 0, text
    staged_everywhere(cluster, dest, dataset)
    nothing_left(cluster, dest, [node_root(cluster, n) / dest.lstrip("/") for n in cluster.nodes])


def test_a_link_that_drops_for_two_seconds_only_slows_staging(
    cluster: VCluster, dataset: Path, dest: str, work: Path
) -> None:
    """node03's link is down for 2 s mid-staging, then back. Expected: the run completes, slower,
    correct: TCP resends what the drop lost (its backoff adds a few seconds), well inside
    MLHPC_COLLECTIVE_TIMEOUT (DROP_TIMEOUT_S), and Slurm's SlurmdTimeout (30 s) never notices.
    Bound: every rank ends within 2 x the transfer at the link rate + the drop + the timeout."""
    set_rates(cluster, dict.fromkeys(cluster.nodes, RATE_MBIT))
    received_s = FILES * FILE_BYTES * 3 / 4 / (RATE_MBIT * 1e6 / 8)  # each node gets 3/4 of the set
    bound = 2 * received_s + 2 + DROP_TIMEOUT_S
    out = work / "out"
    job = srun(cluster, list(cluster.nodes), stage_argv(dataset, dest), out, DROP_TIMEOUT_S)
    try:
        wait_for(staging_started(cluster, dest, job), "staging to begin", 90, interval=0.1)
        time.sleep(0.5)
        started = time.monotonic()
        link(cluster, "node03", "down")
        try:
            time.sleep(2)
        finally:
            link(cluster, "node03", "up")
        stopped = stop_times(cluster, dest, started, bound)
        code, text = finish(job)
    finally:
        if job.poll() is None:
            job.kill()
    print(f"2 s drop: ranks ended after {stopped} s (bound {bound:.1f} s)")
    assert code == 0, (text, error_lines(out))
    assert max(stopped.values()) <= bound, stopped
    no_traceback(text)
    staged_everywhere(cluster, dest, dataset)
    nothing_left(cluster, dest, [node_root(cluster, n) / dest.lstrip("/") for n in cluster.nodes])


def test_one_slow_link_makes_staging_slower_and_still_correct(
    cluster: VCluster, dataset: Path, dest: str, work: Path
) -> None:
    """node02's link at a quarter of the others' rate: replicate completes, correct, and slower
    than with every link at the same rate, at least by what node02's link alone must carry.
    Bound: 2 x that transfer time + startup."""
    slow = RATE_MBIT // 4
    argv = stage_argv(dataset, dest)

    def staged_in() -> float:
        """The staging's own time, as rank 0 reports it ("staged 12 files, ... in 5.1 s (...")."""
        out = work / uuid.uuid4().hex
        code, text = finish(srun(cluster, list(cluster.nodes), argv, out))
        assert code == 0, text
        no_traceback(text, *(p.read_text() for p in out.iterdir()))
        report = (out / "node01.out").read_text()
        return float(report.split(" in ", 1)[1].split(" s ", 1)[0])

    set_rates(cluster, dict.fromkeys(cluster.nodes, RATE_MBIT))
    even = staged_in()
    for node in cluster.nodes:
        cluster.exec(node, ["rm", "-rf", dest])
    set_rates(cluster, {"node02": slow})
    try:
        uneven = staged_in()
    finally:
        set_rates(cluster, {"node02": RATE_MBIT})
    # node02 receives 3/4 of the set through its slow link (and sends its quarter three times)
    floor = FILES * FILE_BYTES * 3 / 4 / (slow * 1e6 / 8)
    print(f"slow link: staged in {uneven:.1f} s, {even:.1f} s with even links; node02's floor {floor:.1f} s")
    assert uneven >= 0.9 * floor and uneven > 1.5 * even, (uneven, even, floor)
    assert uneven <= 2 * floor + 10, (uneven, floor)
    staged_everywhere(cluster, dest, dataset)
    nothing_left(cluster, dest, [node_root(cluster, n) / dest.lstrip("/") for n in cluster.nodes])


def test_a_full_local_on_one_node_stops_every_rank_naming_it(
    cluster: VCluster, work: Path, dest: str
) -> None:
    """node04's /local (a 16 MiB tmpfs) cannot hold a 24 MiB set. Expected: the space check
    before any copy fails there, and the agreement gives every rank node04's line; the ranks
    stop at once (bound: EXIT_S after the agreement, 30 s for the whole run). Made larger, the
    same command completes."""
    big = work / "big"
    big.mkdir()
    for i in range(24):
        (big / f"b{i:02d}.bin").write_bytes(os.urandom(FILE_BYTES))
    subprocess.run(["mlhpc", "manifest", str(big)], check=True, capture_output=True, env=cli_env())
    set_rates(cluster, dict.fromkeys(cluster.nodes, None))
    assert cluster.exec("node04", ["mount", "-o", "remount,size=16M", "/local"]).returncode == 0
    out = work / "out"
    started = time.monotonic()
    job = srun(cluster, list(cluster.nodes), ["mlhpc", "stage", str(big), dest, "--mode", "replicate"], out)
    code, text = finish(job)
    took = time.monotonic() - started
    print(f"full /local: every rank stopped {took:.1f} s after srun began")
    assert code != 0 and took < 30 + 30, (code, took)  # 30 s: startup of 4 ranks on this machine
    no_traceback(text, *(p.read_text() for p in out.iterdir()))
    lines = error_lines(out)
    print("full /local:", lines["node01"])
    assert set(lines) == set(cluster.nodes)
    for node, found in lines.items():
        assert len(found) == 1, (node, found)
        assert found[0].startswith(f"mlhpc: error: rank 3 on node04: not enough space on {dest}"), found
    staged_nowhere(cluster, dest)
    nothing_left(cluster, dest, [node_root(cluster, n) / dest.lstrip("/") for n in cluster.nodes])
    try:  # room made on node04: the same command completes
        cluster.exec("node04", ["mount", "-o", "remount,size=64M", "/local"])
        rerun = srun(cluster, list(cluster.nodes), ["mlhpc", "stage", str(big), dest], work / "rerun")
        code, text = finish(rerun)
        assert code == 0, text
        for node in cluster.nodes:
            assert "24 files verified" in cluster.exec(node, ["mlhpc", "verify", dest]).stdout
    finally:
        cluster.exec("node04", ["rm", "-rf", dest])
        cluster.exec("node04", ["mount", "-o", "remount,size=16M", "/local"])


# `mlhpc run` with its staging slowed to 0.3 s a file once training has read a sample (see
# tests/helpers/slow_staging.py), so that a node killed at epoch 2 dies mid-staging.
SLOW_STAGING_RUN = """
import sys, time
from mlhpc import cli
from mlhpc.staging import parallel
from mlhpc.staging.engine import demand_copies
real, read = parallel.copy_once, []
def slow(src, dest, entry, options, by, *rest):
    while not read:
        if demand_copies(options.claims) > 4:
            read.append(True)
        time.sleep(0.01)
    time.sleep(0.3)
    return real(src, dest, entry, options, by, *rest)
parallel.copy_once = slow
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("staging", ["inside", "overlap"])
def test_a_node_killed_mid_training_stops_the_run_and_resume_finishes_it(
    cluster: VCluster, cosmo_data: Path, work: Path, staging: str
) -> None:
    """A 2-node DDP run of the CosmoFlow mini under srun; at epoch 2 every mlhpc process on
    node02 gets SIGKILL. Expected: node01's all-reduce fails at once (its socket to node02
    closes), it looks who still answers and stops with node02's name and "--resume"; the run's
    log is discarded, so nothing counts as a result. Bound: KILLED_BOUND_S (33.5 s) after the
    kill. `--resume`, launched the same way, trains the run to the end. With --staging overlap
    the node dies mid-staging too (slowed), and the staging thread stops with the run."""
    set_rates(cluster, dict.fromkeys(cluster.nodes, None))
    data = work / "cosmo"
    shutil.copytree(cosmo_data, data)
    runs = work / "runs"
    command = ["mlhpc"] if staging == "inside" else [sys.executable, "-c", SLOW_STAGING_RUN]
    argv = [
        *command, "run", "cosmoflow", "--config", "mini", "--seeds", "1", "--first-seed", "7",
        "--out", str(runs), "--data", str(data), "--local-dir", "/local/train-faults",
        "--system", "vc2", "--no-check", "data.num_train_samples=32", "data.num_eval_samples=8",
        "loop.mode=fixed_epochs", "loop.max_epochs=16", "--staging", staging,
    ]  # fmt: skip
    out = work / "out"
    job = srun(cluster, ["node01", "node02"], argv, out)
    try:

        def second_epoch() -> bool:
            if job.poll() is not None:
                raise AssertionError(f"the run ended before its second epoch: {finish(job)}")
            return re.search(r"epoch +2/16 ", text_of(out / "node01.out")) is not None

        wait_for(second_epoch, "epoch 2 on node01", 180, interval=0.1)
        victims = mine(cluster, str(runs)).get("node02", [])
        assert victims and job.poll() is None
        killed = time.monotonic()
        for pid in victims:
            os.kill(pid, 9)
        stopped = stop_times(cluster, str(runs), killed, KILLED_BOUND_S)
        code, text = finish(job)
    finally:
        if job.poll() is None:
            job.kill()
    print(f"killed node: ranks stopped after {stopped} s (bound {KILLED_BOUND_S} s)")
    assert max(stopped.values()) <= KILLED_BOUND_S, stopped
    assert code != 0
    no_traceback(text, *(p.read_text() for p in out.iterdir()))
    line = error_lines(out)["node01"]
    print("killed node:", line)
    assert len(line) == 1 and line[0].startswith("mlhpc: error: rank 0 on node01: a collective failed"), line
    assert "node02 (rank 1) stopped answering" in line[0] and "--resume" in line[0], line
    results = runs / "mlhpc" / "results" / "vc2" / "strong" / "cosmoflow"
    assert list(results.glob("result_*.txt")) == []  # nothing counts as a result
    nothing_left(cluster, str(runs), [runs])
    if staging == "overlap":  # it died mid-staging: nothing marked staged on node01
        assert not list((node_root(cluster, "node01") / "local" / "train-faults").rglob(STAGED_MARKER))
    # --resume, launched the same way, trains the run to the end
    code, text = finish(srun(cluster, ["node01", "node02"], [*argv, "--resume"], work / "resume"))
    assert code == 0, text
    logs = list(results.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt"]
    lines = logs[0].read_text().splitlines()
    stop = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in lines if '"run_stop"' in x]
    assert stop and stop[-1]["metadata"]["status"] == "success", stop
    nothing_left(cluster, str(runs), [runs])
