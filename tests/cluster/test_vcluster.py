"""scripts/vcluster: hosts in Linux namespaces with a real Slurm, up in under 30 s; srun reaches
each node with its own hostname, address and /local; the host's network namespace is untouched;
`down` leaves nothing, also after a failed or killed `up`; shaping, a small /local, link faults."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from scripts.vclusterlib.client import VCLUSTER, run_vcluster
from tests.helpers.vcluster_fixture import (
    NODES,
    VCluster,
    host_network,
    leftovers,
    start_cluster,
    stop_cluster,
    vcluster_missing,
)

pytestmark = pytest.mark.cluster

needs_cluster = pytest.mark.skipif(vcluster_missing() is not None, reason=vcluster_missing() or "")

# Receives until EOF and prints the rate from its first byte to the end (Mbit/s).
RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); n = len(c.recv(1 << 20)); t = time.monotonic()
while b := c.recv(1 << 20):
    n += len(b)
print(n * 8 / (time.monotonic() - t) / 1e6)
"""
SENDER = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
c.sendall(b"x" * int(sys.argv[3])); c.close()
"""
# Connects to a closed port: "refused" means the host answered (reachable); else the error's kind.
PROBE = """
import socket, sys, time
t = time.monotonic()
try:
    socket.create_connection((sys.argv[1], 9), timeout=float(sys.argv[2])); print("connected")
except ConnectionRefusedError:
    print("refused", time.monotonic() - t)
except OSError as e:
    print(type(e).__name__, time.monotonic() - t)
"""


def mbit_s(cluster: VCluster, src: str, dst: str, nbytes: int) -> float:
    """TCP throughput from node `src` to node `dst`, measured at the receiver."""
    receiver = subprocess.Popen(
        [str(VCLUSTER), "exec", "--name", cluster.name, dst, "--", "python3", "-c", RECEIVER, "5001"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "listening"
        cluster.exec(src, ["python3", "-c", SENDER, dst, "5001", str(nbytes)], timeout=60)
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    return float(out.split()[-1])


def probe(cluster: VCluster, src: str, dst: str, timeout_s: float = 1.5) -> list[str]:
    return cluster.exec(src, ["python3", "-c", PROBE, dst, str(timeout_s)]).stdout.split()


def assert_local_restored(existed_before: bool) -> None:
    """The host's /local mount point goes with the last cluster if a cluster made it."""
    others = (
        [p for p in Path("/run/vcluster").iterdir() if p.is_dir()] if Path("/run/vcluster").is_dir() else []
    )
    if not existed_before and not others:
        assert not Path("/local").exists()


def test_up_under_30_s_and_srun_runs_on_every_node(vcluster: VCluster) -> None:
    assert vcluster.up_wall_s < 30, f"scripts/vcluster up took {vcluster.up_wall_s:.1f} s"
    out = vcluster.exec(
        "login",
        [
            "srun",
            "-N",
            str(NODES),
            "sh",
            "-c",
            "echo $(hostname) $(hostname -I) $(readlink /proc/self/ns/net)",
        ],
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == [f"node{i:02d}" for i in range(1, NODES + 1)]
    for host, address, _ in rows:
        assert address == vcluster.addresses[host]
    netns = {r[2] for r in rows}
    assert len(netns) == NODES and os.readlink("/proc/self/ns/net") not in netns


def test_each_task_sees_its_own_local_and_tmp(vcluster: VCluster) -> None:
    token = f"own-{uuid.uuid4().hex[:8]}"
    mine = f"{token}-$(hostname)"
    try:
        out = vcluster.exec(
            "login",
            [
                "srun",
                "-N",
                str(NODES),
                "sh",
                "-c",
                f"hostname | tee /local/{mine} /tmp/{mine} && ls /local /tmp",
            ],
        ).stdout
        seen = sorted(name for name in out.split() if name.startswith(token))
        # each node lists only its own file, once in /local and once in /tmp
        assert seen == sorted(2 * [f"{token}-{node}" for node in vcluster.nodes])
        for node in vcluster.nodes:
            assert (vcluster.local_dir(node) / f"{token}-{node}").read_text().strip() == node
            assert (
                vcluster.state_dir / "nodes" / node / "tmp" / f"{token}-{node}"
            ).read_text().strip() == node
        assert not list(Path("/local").glob(f"{token}*")), "a node's /local wrote into the host's /local"
        assert not list(Path("/tmp").glob(f"{token}*")), "a node's /tmp wrote into the host's /tmp"
    finally:
        for node in vcluster.nodes:
            (vcluster.local_dir(node) / f"{token}-{node}").unlink(missing_ok=True)


def test_host_network_namespace_is_untouched(vcluster: VCluster) -> None:
    after = host_network()
    assert after == vcluster.host_network_before
    subnet = ipaddress.ip_network(vcluster.subnet)
    for entry in after["addresses"] + after["routes"]:
        word = entry.split()[1] if entry in after["addresses"] else entry.split()[0]
        if word not in ("None", "default") and "." in word:
            assert not ipaddress.ip_network(word, strict=False).overlaps(subnet), entry
    # the subnet is live inside the cluster: login reaches node01 (its slurmd answers the connect)
    assert probe(vcluster, "login", "node01")[0] == "refused"


def test_exec_keeps_the_working_directory_and_gives_the_slurm_config(
    vcluster: VCluster, tmp_path: Path
) -> None:
    out = vcluster.exec("login", ["sh", "-c", "pwd; hostname; echo $SLURM_CONF"], cwd=tmp_path).stdout.split()
    assert out == [str(tmp_path), "login", str(vcluster.slurm_conf)]


@needs_cluster
def test_small_local_rate_shaping_and_link_faults() -> None:
    local_before = Path("/local").exists()
    cluster = start_cluster(
        f"pt{os.getpid()}o", "--nodes", "2", "--small-local", "node02:8M", "--rate", "100mbit"
    )
    try:
        size, fstype = cluster.exec("node02", ["df", "-B1", "--output=size,fstype", "/local"]).stdout.split()[
            -2:
        ]
        assert (int(size), fstype) == (8 << 20, "tmpfs")
        fill = cluster.exec(
            "node02", ["dd", "if=/dev/zero", "of=/local/fill", "bs=1M", "count=9"], check=False
        )
        assert fill.returncode != 0 and "No space left" in fill.stderr
        cluster.exec("node01", ["sh", "-c", "echo here > /local/mark"])
        assert (cluster.local_dir("node01") / "mark").read_text() == "here\n"

        assert mbit_s(cluster, "node01", "node02", 3 << 20) < 130  # shaped at up: 100 Mbit/s each way
        for node in cluster.nodes:
            assert run_vcluster("shape", "--name", cluster.name, node, "--clear").returncode == 0
        assert mbit_s(cluster, "node01", "node02", 8 << 20) > 300
        assert run_vcluster("shape", "--name", cluster.name, "node02", "--rate", "20mbit").returncode == 0
        assert mbit_s(cluster, "node02", "node01", 1 << 20) < 26
        shapes = {n["name"]: n["shape"] for n in cluster.status()["nodes"]}
        assert shapes == {"node01": None, "node02": {"rate": "20mbit", "delay": None}}

        delay = run_vcluster("shape", "--name", cluster.name, "node01", "--delay", "5ms")
        if delay.returncode == 0:  # the kernel has netem: 5 ms each way on node01's link
            assert float(probe(cluster, "node01", "node02")[1]) >= 0.010
        else:  # this kernel has no netem (CONFIG_NET_SCH_NETEM): refused in one line naming it
            assert "netem" in delay.stderr and len(delay.stderr.strip().splitlines()) == 1

        assert probe(cluster, "node01", "node02")[0] == "refused"
        assert run_vcluster("link", "--name", cluster.name, "node02", "down").returncode == 0
        assert probe(cluster, "node01", "node02")[0] != "refused"
        assert run_vcluster("link", "--name", cluster.name, "node02", "up").returncode == 0
        assert probe(cluster, "node01", "node02", timeout_s=5)[0] == "refused"
    finally:
        stop_cluster(cluster)
    assert leftovers(cluster.state_dir) == []
    assert_local_restored(local_before)


@needs_cluster
def test_down_leaves_nothing_even_with_a_job_running() -> None:
    local_before = Path("/local").exists()
    cluster = start_cluster(f"pt{os.getpid()}d", "--nodes", "2")
    job = subprocess.Popen(
        [str(VCLUSTER), "exec", "--name", cluster.name, "login", "--", "srun", "-N", "2", "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while "sleep" not in cluster.exec("login", ["squeue", "-h", "-t", "R", "-o", "%j"]).stdout:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        assert leftovers(cluster.state_dir)  # the check sees a running cluster
        down = run_vcluster("down", "--name", cluster.name)
        assert down.returncode == 0, down.stderr
        assert job.wait(timeout=10) != 0  # srun ended with its cluster
    finally:
        job.kill()
    assert leftovers(cluster.state_dir) == []
    assert host_network() == cluster.host_network_before
    assert_local_restored(local_before)
    again = run_vcluster("down", "--name", cluster.name)
    assert again.returncode == 0 and "nothing to do" in again.stdout


@needs_cluster
def test_a_failed_up_takes_down_what_it_started() -> None:
    name = f"pt{os.getpid()}f"
    before = host_network()
    proc = run_vcluster(
        "up", "--name", name, "--nodes", "2", env={**os.environ, "VCLUSTER_FAIL_AT": "slurmd"}
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["vcluster: injected failure at slurmd (VCLUSTER_FAIL_AT)"]
    assert leftovers(Path("/run/vcluster") / name) == []
    assert host_network() == before


@needs_cluster
def test_down_cleans_up_after_a_killed_up(tmp_path: Path) -> None:
    name = f"pt{os.getpid()}k"
    state_dir = Path("/run/vcluster") / name
    log = tmp_path / "up.err"
    with open(log, "w") as err:
        up = subprocess.Popen(
            [str(VCLUSTER), "up", "--name", name, "--nodes", "2"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "VCLUSTER_HANG_AT": "slurmd"},
        )
    try:
        deadline = time.monotonic() + 30
        while "hanging at slurmd" not in log.read_text():
            assert up.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "up did not reach slurmd"
            time.sleep(0.1)
        assert leftovers(state_dir)  # namespaces, munged, slurmctld and slurmd are running
    finally:
        up.send_signal(signal.SIGKILL)  # no chance to clean up: down must do it
        up.wait()
    down = run_vcluster("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(state_dir) == []


def test_refuses_without_root_in_one_line() -> None:
    if os.geteuid() != 0:  # already not root: run it as is
        proc = run_vcluster("up", "--name", "ptnoroot")
    else:
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                str(VCLUSTER),
                "up",
                "--name",
                "ptnoroot",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "vcluster: needs root (namespaces, mounts, Slurm daemons); run it as root, e.g. with sudo"
    ]
    assert not Path("/run/vcluster/ptnoroot").exists()


@needs_cluster
def test_a_missing_daemon_names_its_package() -> None:
    proc = run_vcluster("up", "--name", "ptnotools", env={**os.environ, "PATH": "/nonexistent"})
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == "vcluster: slurmd not found; install it: apt-get install slurmd (or slurm-wlm)"
    )
    assert not Path("/run/vcluster/ptnotools").exists()


def test_status_json_names_every_host(vcluster: VCluster) -> None:
    status = vcluster.status()
    assert status["up"] is True and status["state_dir"] == str(vcluster.state_dir)
    assert [n["name"] for n in status["nodes"]] == list(vcluster.nodes)
    assert all(n["running"] and n["link"] == "up" for n in status["nodes"])
    assert json.loads(json.dumps(status)) == status


@needs_cluster
def test_a_folder_in_tmp_stays_seen_over_each_nodes_own_tmp_and_outlives_down(tmp_path: Path) -> None:
    """A checkout in /tmp (CI clones there) is what every job runs: --see keeps it visible on each
    node, whose own /tmp hides the host's, and `down` removes the node's /tmp, never the folder."""
    seen = Path("/tmp") / f"mlhpc-see-{uuid.uuid4().hex[:8]}"
    (seen / "code").mkdir(parents=True)
    (seen / "code" / "file").write_text("kept\n")
    (seen / "hidden").mkdir()
    try:
        refused = run_vcluster("up", "--name", f"pt{os.getpid()}s", "--see", "/etc")
        assert refused.returncode != 0 and "only a folder inside /tmp" in refused.stderr
        assert not (Path(os.environ.get("VCLUSTER_ROOT", "/run/vcluster")) / f"pt{os.getpid()}s").exists()
        cluster = start_cluster(f"pt{os.getpid()}s", "--nodes", "2", "--see", str(seen / "code"))
        try:
            for node in cluster.nodes:
                out = cluster.exec(node, ["sh", "-c", f"cat {seen}/code/file; ls {seen}"]).stdout.split()
                assert out == ["kept", "code"], (node, out)  # the sibling not given stays hidden
            cluster.exec("node01", ["touch", f"{seen}/code/written-on-node01"])
        finally:
            stop_cluster(cluster)
        assert (seen / "code" / "file").read_text() == "kept\n"
        assert (seen / "code" / "written-on-node01").exists()  # the node wrote into the host's folder
        assert leftovers(cluster.state_dir) == []
    finally:
        shutil.rmtree(seen)
