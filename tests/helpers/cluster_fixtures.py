"""A real single-node Slurm cluster (munged, slurmctld, slurmd) for the launcher tests, and the
checks that tell which launchers this machine has. Nothing here is a mock: the daemons run."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.vclusterlib.slurm import slurm_conf_text
from tests.helpers.cli import cli_env

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd")
SLURM_CLIENTS = ("sinfo", "srun", "sbatch", "scancel", "munge", "unmunge")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
UP_TIMEOUT_S = 30


@dataclass(frozen=True)
class SlurmCluster:
    """A running single-node cluster; `env()` is what a client command needs to reach it."""

    conf: Path
    node: str
    cpus: int

    def env(self, **extra: str) -> dict[str, str]:
        # cli_env drops every SLURM_* variable; the clients need SLURM_CONF back to find this cluster.
        return cli_env(SLURM_CONF=str(self.conf), **extra)


def missing_slurm() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    missing = [name for name in (*SLURM_DAEMONS, *SLURM_CLIENTS) if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install slurm-wlm, as .ci/run does)"
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, node: str, cpus: int) -> str:
    """A minimal single-node configuration; its own ports, so a cluster already on the machine is left alone."""
    files = {
        "StateSaveLocation": f"{root}/ctld",
        "SlurmdSpoolDir": f"{root}/d",
        "SlurmctldPidFile": f"{root}/slurmctld.pid",
        "SlurmdPidFile": f"{root}/slurmd.pid",
        "SlurmctldLogFile": f"{root}/slurmctld.log",
        "SlurmdLogFile": f"{root}/slurmd.log",
    }
    return slurm_conf_text(
        cluster_name="mlhpctest",
        controller=(node, "127.0.0.1"),
        ports=(free_port(), free_port()),
        nodes=[(node, "127.0.0.1")],
        cpus=cpus,
        files=files,
        settings=["SelectTypeParameters=CR_Core"],
        node_options=" RealMemory=2000",
    )


def munge_works() -> bool:
    try:
        encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        decoded = subprocess.run(
            ["unmunge"], input=encoded.stdout, capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return encoded.returncode == 0 and decoded.returncode == 0


def wait_until(check: Callable[[], bool], what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in logs if p.is_file())
    raise RuntimeError(f"{what} not up after {UP_TIMEOUT_S} s\n{tails}")


def start_munged(processes: list[subprocess.Popen[bytes]]) -> None:
    """Reuse a working munged (another job may rely on it), else start one in the foreground as munge."""
    if munge_works():
        return
    if not Path("/etc/munge/munge.key").is_file():
        pytest.skip("munged has no key: /etc/munge/munge.key is missing (apt-get install munge creates it)")
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
    munged = shutil.which("munged")
    assert munged is not None
    processes.append(subprocess.Popen([munged, "--foreground"], user="munge", group="munge"))
    wait_until(munge_works, "munged", [])


def idle(conf: Path) -> bool:
    proc = subprocess.run(
        ["sinfo", "-h", "-o", "%T"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    return proc.returncode == 0 and proc.stdout.split()[:1] == ["idle"]


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture() -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd started from a temporary slurm.conf (SLURM_CONF), torn down after."""
    reason = missing_slurm()
    if reason:
        pytest.skip(reason)
    # A short path: slurmd puts the steps' Unix sockets in its spool directory (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="mlhpc-slurm-"))
    for sub in ("ctld", "d"):
        (root / sub).mkdir()
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, node, cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        start_munged(processes)
        for daemon in ("slurmctld", "slurmd"):
            log = open(root / f"{daemon}.stderr", "wb")  # noqa: SIM115 - the daemon keeps writing to it
            processes.append(subprocess.Popen([daemon, "-D"], env=env, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        logs = [
            root / "slurmctld.log",
            root / "slurmd.log",
            root / "slurmctld.stderr",
            root / "slurmd.stderr",
        ]
        wait_until(lambda: idle(conf), f"the Slurm node {node} (idle in sinfo)", logs)
        yield SlurmCluster(conf=conf, node=node, cpus=cpus)
    finally:
        if processes and processes[-1].poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # end the jobs a failed test left behind
                subprocess.run(
                    ["scancel", "--full", "--quiet", "-u", "root"], env=env, timeout=30, check=False
                )
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
