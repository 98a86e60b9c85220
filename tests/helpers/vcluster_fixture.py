"""The test session's virtual cluster: 4 hosts in Linux namespaces running a real Slurm
(scripts/vcluster), brought up once for the whole session and taken down at its end.

Fixture `vcluster` (session scope; a plugin named in tests/conftest.py, so a test just asks for
it) yields a `VCluster`: its `name`, `state_dir`, `nodes` ("node01".."node04"), `addresses`
(host name -> address, "login" included), `subnet`, `slurm_conf`, `shared` (a folder every
host sees; each node's /tmp is its own, as on a real cluster, so data for the nodes goes here, not
in tmp_path), `up_wall_s`, each node's host-side /local folder (`local_dir`), and `exec(host, argv)`, which runs a command on a host of
the cluster: "login" for clients (srun, sbatch, `mlhpc run --slurm`), "nodeNN" on a node. Never
run a Slurm client, torchrun or mpirun from the host's own network namespace: its packets to the
cluster's addresses would leave the machine (docs/MULTINODE.md). It skips, with the reason, where
not root or where Slurm, munge or util-linux's unshare are missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts.vclusterlib.client import run_vcluster, seen_by_nodes
from tests.helpers.cli import REPO, cli_env

NODES = 4
NEEDED = {
    "slurmd": "slurm-wlm",
    "slurmctld": "slurm-wlm",
    "srun": "slurm-wlm",
    "munged": "munge",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "tc": "iproute2",
}


def vcluster_missing() -> str | None:
    """Why scripts/vcluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "scripts/vcluster needs root (namespaces, mounts, Slurm daemons)"
    missing = [name for name in NEEDED if shutil.which(name) is None]
    if missing:
        packages = sorted({NEEDED[name] for name in missing})
        return f"{', '.join(missing)} not found (apt-get install {' '.join(packages)})"
    if not Path("/usr/bin/python3").is_file():
        return "scripts/vcluster runs on /usr/bin/python3, which is missing"
    return None


def host_network() -> dict[str, list[str]]:
    """The host network namespace's interfaces, addresses and routes (read, never used)."""
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    addrs = json.loads(
        subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    )
    routes = []
    for family in ("-4", "-6"):
        out = subprocess.run(["ip", family, "-j", "route"], capture_output=True, text=True, check=True).stdout
        routes += [f"{r.get('dst')} {r.get('dev')} {r.get('gateway', '')}" for r in json.loads(out)]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {
        "links": sorted(link["ifname"] for link in links),
        "addresses": sorted(
            f"{a['ifname']} {i['local']}/{i['prefixlen']}" for a in addrs for i in a["addr_info"]
        ),
        "routes": sorted(routes),
        "netns": sorted(netns.split()),
    }


def leftovers(state_dir: Path) -> list[str]:
    """What a cluster left on the machine: its state folder, any process naming it on its command
    line or holding a mount from it, and any mount of the host naming it."""
    needle = f"{state_dir}/"
    found = [f"state folder {state_dir}"] if state_dir.exists() else []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            mounts = (proc / "mountinfo").read_text()
        except OSError:
            continue
        if needle.encode() in cmdline or needle in mounts:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
            found.append(f"process {proc.name}: {command}")
    found += [
        f"mount: {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if needle in line
    ]
    return found


@dataclass(frozen=True)
class VCluster:
    """A running cluster of scripts/vcluster; `exec` runs commands on its hosts."""

    name: str
    state_dir: Path
    nodes: tuple[str, ...]
    addresses: dict[str, str]
    subnet: str
    slurm_conf: Path
    shared: Path
    """A folder every host sees at this path (the nodes' /tmp is their own); gone at down."""
    up_wall_s: float
    host_network_before: dict[str, list[str]] = field(repr=False)

    def exec(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float = 120,
        check: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `host` ("login" or "nodeNN") with this venv first on PATH, one thread
        per rank and the cluster's SLURM_CONF; `check` fails the test on a non-zero exit."""
        proc = run_vcluster(
            "exec",
            "--name",
            self.name,
            host,
            "--",
            *argv,
            timeout=timeout,
            cwd=cwd,
            input=input,
            env=cli_env(OMP_NUM_THREADS="1", **(env or {})),
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"on {host}: {' '.join(argv)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
            )
        return proc

    def local_dir(self, node: str) -> Path:
        """The host-side folder that is `node`'s /local."""
        return self.state_dir / "nodes" / node / "local"

    def status(self) -> dict[str, Any]:
        return json.loads(run_vcluster("status", "--name", self.name, "--json").stdout)


def code_seen_by_nodes() -> list[str]:
    """`--see` for this checkout and its Python where they lie in /tmp (CI clones there): each
    node has its own /tmp, which would hide them, and every job runs this code."""
    return seen_by_nodes([REPO, Path(sys.prefix)])


def start_cluster(name: str, *args: str) -> VCluster:
    """`scripts/vcluster up --name NAME ARGS`; fails the test (with the tool's line) if it fails."""
    before = host_network()
    started = time.monotonic()
    proc = run_vcluster("up", "--name", name, *args, *code_seen_by_nodes())
    wall = time.monotonic() - started
    if proc.returncode != 0:
        pytest.fail(f"scripts/vcluster up --name {name} {' '.join(args)} failed: {proc.stderr.strip()}")
    status = json.loads(run_vcluster("status", "--name", name, "--json").stdout)
    return VCluster(
        name=name,
        state_dir=Path(status["state_dir"]),
        nodes=tuple(n["name"] for n in status["nodes"]),
        addresses={"login": status["login"]["address"], **{n["name"]: n["address"] for n in status["nodes"]}},
        subnet=status["subnet"],
        slurm_conf=Path(status["slurm_conf"]),
        shared=Path(status["shared"]),
        up_wall_s=wall,
        host_network_before=before,
    )


def stop_cluster(cluster: VCluster) -> None:
    proc = run_vcluster("down", "--name", cluster.name)
    assert proc.returncode == 0, f"scripts/vcluster down --name {cluster.name}: {proc.stderr.strip()}"


@contextlib.contextmanager
def own_cluster(name: str, *args: str) -> Iterator[VCluster]:
    """A cluster for the `with` block (`up --name NAME ARGS`), down at its end; skips where
    scripts/vcluster cannot run."""
    reason = vcluster_missing()
    if reason:
        pytest.skip(reason)
    run_vcluster("down", "--name", name)  # a cluster of a killed session that had this PID
    cluster = start_cluster(name, *args)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="session")
def vcluster() -> Iterator[VCluster]:
    """One 4-node cluster for the whole test session, named after this pytest process."""
    with own_cluster(f"pt{os.getpid()}", "--nodes", str(NODES)) as cluster:
        yield cluster
