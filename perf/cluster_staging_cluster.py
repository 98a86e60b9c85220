"""perf/cluster_staging.py's cluster: the study's error and rates, the virtual cluster with its
storage node (sshd) and each node's sshfs mount, brought up, reshaped and taken down."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # after the installed mlhpc: the repo's scripts/ package, vcluster's client
from scripts.vclusterlib.base import VclusterError  # noqa: E402
from scripts.vclusterlib.client import VCLUSTER, run_vcluster, seen_by_nodes  # noqa: E402
from scripts.vclusterlib.network import rate_bytes_s  # noqa: E402


class StudyError(Exception):
    """One line for the user: what failed and what to do."""


def bits_per_s(rate: str) -> float:
    """tc's rate syntax (50mbit, 1gbit) in bits per second: vcluster's parser, this study's error."""
    try:
        return rate_bytes_s(rate) * 8
    except VclusterError:
        raise StudyError(f"rate {rate!r}: give it as tc does, e.g. 50mbit or 1gbit") from None


# --- the cluster --------------------------------------------------------------------------------


def work_dir(name: str) -> Path:
    """On the host's disk, which every host of the cluster sees (each node has its own /tmp)."""
    return Path(os.environ.get("CLUSTER_STAGING_WORK", "/var/tmp")) / f"mlhpc-cluster-staging-{name}"


def _vcluster(name: str, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = run_vcluster(args[0], "--name", name, *args[1:], timeout=timeout, env=_client_env())
    if check and proc.returncode != 0:
        raise StudyError(
            f"scripts/vcluster {' '.join(args[:2])} failed: {(proc.stderr or proc.stdout).strip()[-400:]}"
        )
    return proc


def on_host(
    name: str, host: str, command: str, *, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`command` (sh) on a host of the cluster: login for Slurm clients, nodeNN, never here."""
    return _vcluster(name, "exec", host, "--", "sh", "-c", command, check=check, timeout=timeout)


def _client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def load_setup(name: str) -> dict:
    path = work_dir(name) / "setup.json"
    if not path.exists():
        raise StudyError(f"no study cluster '{name}'; start it: perf/cluster_staging.py up --name {name}")
    return json.loads(path.read_text())


TINY_BYTES = 64 << 10
"""The tiny dataset's one file: the fixed cost of a staging (`calibrate`), no bytes worth timing."""


def file_sizes(total_mib: int, file_mib: int) -> list[int]:
    """The study's dataset: `total_mib` in files of `file_mib` (one file at the least)."""
    return [file_mib << 20] * max(1, total_mib // file_mib)


def _make_dataset(root: Path, sizes: list[int]) -> None:
    """Random files of `sizes` bytes under `root`, with their manifest."""
    root.mkdir(parents=True)
    for i, size in enumerate(sizes):
        (root / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    subprocess.run(
        [Path(sys.executable).parent / "mlhpc", "manifest", str(root)], check=True, capture_output=True
    )


def cmd_up(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise StudyError("perf/cluster_staging.py up needs root (scripts/vcluster does); run it as root")
    for tool in ("sshfs", "fusermount3", "/usr/sbin/sshd", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise StudyError(f"{tool} not found: apt-get install -y openssh-server sshfs")
    work = work_dir(args.name)
    if work.exists():
        raise StudyError(
            f"{work} exists: a study cluster is up or left over; perf/cluster_staging.py down --name {args.name}"
        )
    link, fs = bits_per_s(args.link), bits_per_s(args.fs)
    nodes = [f"node{i:02d}" for i in range(1, args.nodes + 1)]
    storage = f"node{args.nodes + 1:02d}"
    local_mib = args.total_mib * 2 + 64
    work.mkdir(parents=True)
    setup = {
        "name": args.name, "nodes": nodes, "storage": storage, "link": args.link, "fs": args.fs,
        "link_bit_s": link, "fs_bit_s": fs, "work": str(work), "data": str(work / "data"),
        "mount": str(work / "mnt"), "tiny": str(work / "tiny"), "tiny_mount": str(work / "tiny-mnt"),
    }  # fmt: skip
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    _make_dataset(work / "data", file_sizes(args.total_mib, args.file_mib))
    _make_dataset(work / "tiny", [TINY_BYTES])
    smalls = [f"--small-local={n}:{local_mib}M" for n in nodes] + [f"--small-local={storage}:16M"]
    see = seen_by_nodes([REPO, Path(sys.prefix), work])
    _vcluster(args.name, "up", "--nodes", str(args.nodes + 1), "--rate", args.link, *smalls, *see)
    _vcluster(args.name, "shape", storage, "--rate", args.fs)
    on_host(args.name, "login", f"scontrol update NodeName={storage} State=DRAIN Reason=storage")
    setup.update(_start_storage(args.name, work, storage))
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    for node in nodes:
        _mount(args.name, setup, node)
    setup["rtt_ms"] = _probe_rtt(args.name, nodes[0], storage)
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    print(
        f"cluster_staging: {args.name} up: {len(nodes)} compute nodes at {args.link}, storage {storage} at {args.fs} "
        f"(sshfs at {setup['mount']}), idle RTT {setup['rtt_ms']:.3f} ms; dataset {args.total_mib} MiB in {work / 'data'}"
    )


def _start_storage(name: str, work: Path, storage: str) -> dict:
    """sshd inside the storage node's namespaces, serving SFTP to key holders only."""
    ssh = work / "ssh"
    ssh.mkdir(mode=0o700)
    for key in ("key", "hostkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / key)], check=True)
    shutil.copy(ssh / "key.pub", ssh / "authorized_keys")
    (ssh / "sshd_config").write_text(
        "\n".join(
            [
                "Port 22",
                f"HostKey {ssh / 'hostkey'}",
                f"PidFile {ssh / 'sshd.pid'}",
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "Subsystem sftp internal-sftp",
            ]
        )
        + "\n"
    )
    made = not Path("/run/sshd").exists()  # sshd's privilege-separation folder
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = open(ssh / "sshd.log", "w")  # noqa: SIM115 (the daemon keeps it)
    argv = [sys.executable, str(VCLUSTER), "exec", "--name", name, storage, "--"]
    daemon = subprocess.Popen(
        [*argv, "/usr/sbin/sshd", "-D", "-e", "-f", str(ssh / "sshd_config")],
        stdout=log, stderr=log, start_new_session=True, env=_client_env(),
    )  # fmt: skip
    for _ in range(50):
        if "Server listening" in (ssh / "sshd.log").read_text():
            break
        if daemon.poll() is not None:
            raise StudyError(f"sshd on {storage} exited: {(ssh / 'sshd.log').read_text()[-300:]}")
        time.sleep(0.1)
    return {"sshd_pid": daemon.pid, "made_run_sshd": made}


def _ssh_options(work: str) -> str:
    return ",".join(
        [
            f"IdentityFile={work}/ssh/key",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "BatchMode=yes",
            "LogLevel=ERROR",
            "Ciphers=aes128-gcm@openssh.com",
            "Compression=no",
        ]
    )


def _mount(name: str, setup: dict, node: str) -> None:
    """The dataset (and the tiny one) at the same path on `node`, through its own sshfs client."""
    opts = _ssh_options(setup["work"])
    for src, dest in ((setup["data"], setup["mount"]), (setup["tiny"], setup["tiny_mount"])):
        Path(dest).mkdir(exist_ok=True)
        on_host(
            name,
            node,
            f"sshfs root@{setup['storage']}:{src} {dest} -o {opts} && test -f {dest}/mlhpc_manifest.json",
        )


def _probe_rtt(name: str, client: str, server: str) -> float:
    """Median round trip of 1-byte TCP messages between two hosts, idle (ms)."""
    serve = (
        "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        "s.bind(('0.0.0.0',5999));s.listen(1);c,_=s.accept();c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
        "while (b:=c.recv(1)): c.sendall(b)"
    )
    ask = (
        f"import socket,time,statistics;c=socket.create_connection(('{server}',5999));"
        "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1);t=[]\n"
        "for _ in range(200):\n a=time.perf_counter();c.sendall(b'x');c.recv(1);t.append(time.perf_counter()-a)\n"
        "print(statistics.median(t)*1e3)"
    )
    argv = [sys.executable, str(VCLUSTER), "exec", "--name", name, server, "--", sys.executable, "-c", serve]
    echo = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_client_env())
    try:
        time.sleep(1.0)
        out = _vcluster(name, "exec", client, "--", sys.executable, "-c", ask).stdout
        return float(out.split()[-1])
    finally:
        echo.terminate()
        echo.wait(10)


def cmd_shape(args: argparse.Namespace) -> None:
    """New rates for the compute links and the storage link (a check at other rates: new --out)."""
    setup = load_setup(args.name)
    link, fs = bits_per_s(args.link), bits_per_s(args.fs)
    for node in setup["nodes"]:
        _vcluster(args.name, "shape", node, "--rate", args.link)
    _vcluster(args.name, "shape", setup["storage"], "--rate", args.fs)
    setup.update(link=args.link, fs=args.fs, link_bit_s=link, fs_bit_s=fs)
    (Path(setup["work"]) / "setup.json").write_text(json.dumps(setup, indent=1))
    print(f"cluster_staging: compute links {args.link}, storage link {args.fs}")


def cmd_down(args: argparse.Namespace) -> None:
    work = work_dir(args.name)
    setup = json.loads((work / "setup.json").read_text()) if (work / "setup.json").exists() else {}
    for node in setup.get("nodes", []):
        for dest in (setup["mount"], setup["tiny_mount"]):
            on_host(args.name, node, f"fusermount3 -u {dest} 2>/dev/null || true", check=False, timeout=30)
    if pid := setup.get("sshd_pid"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    _vcluster(args.name, "down", check=False)
    if setup.get("made_run_sshd"):
        with contextlib.suppress(OSError):  # not empty: not only ours
            Path("/run/sshd").rmdir()
    shutil.rmtree(work, ignore_errors=True)
    print(f"cluster_staging: {args.name} down")
