#!/usr/bin/env python3
"""Staging at scale on the virtual cluster (scripts/vcluster): `srun -N n mlhpc stage` in copy,
replicate and shard mode at 1-8 nodes, with shaped links and a shared file system of limited
bandwidth, beside a model of it.

The cluster: N compute nodes and one more host, the storage node (drained in Slurm), which
serves the dataset over sshfs (SFTP); each compute node mounts it at the same path in its own
mount namespace, so each has its own client and page cache, as on a real cluster. Every link is
shaped with tc tbf in both directions: the compute nodes' to --link, the storage node's to --fs.
N nodes reading the file system share the storage node's link, as a parallel file system's
clients share its servers; whatever a node receives, from the file system or from its peers,
comes in over its own link. /local is a tmpfs on every node: node-local NVMe is far faster than
these links. Nothing here runs a client in the host's network namespace: every command that
talks to the cluster goes through `scripts/vcluster exec HOST --`.

    perf/cluster_staging.py up [--name cstage] [--nodes 8] [--link 50mbit] [--fs 150mbit]
                            [--total-mib 128] [--file-mib 2]
    perf/cluster_staging.py calibrate [--repeats 5]           # the fixed cost t0 (tiny dataset)
    perf/cluster_staging.py allgather [--nodes 2,3,4,5,6,7,8]  # the exchange's all-gather alone
    perf/cluster_staging.py measure --nodes 2 [--modes copy,replicate,shard] [--repeats 3]
    perf/cluster_staging.py report [--png docs/img/cluster_staging.png]
    perf/cluster_staging.py model [--nodes 1,2,3,4,6,8] [--link 50mbit] [--fs 150mbit]
    perf/cluster_staging.py shape --link 25mbit --fs 75mbit   # a check at other rates
    perf/cluster_staging.py down

Run as root, with `--nice` to change the stage processes' priority. Results go to --out (default runs/cluster-staging): `cluster_staging.csv` (one row per run,
appended, so that each node count can be its own command), `cluster_staging.md` and the plot.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.staging.exchange import HEADER_BYTES, chunk_size
from mlhpc.staging.request import DEFAULT_CHUNK_BYTES
from mlhpc.staging.study.model import MODES, Setup, crossover, model_crossover, model_seconds

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # after the installed mlhpc: the repo's scripts/ package, vcluster's client
from scripts.vclusterlib.base import VclusterError  # noqa: E402
from scripts.vclusterlib.client import VCLUSTER, run_vcluster, seen_by_nodes  # noqa: E402
from scripts.vclusterlib.network import rate_bytes_s  # noqa: E402

COLUMNS = [
    "date", "commit", "nodes", "mode", "repeat", "stage_s", "wall_s", "dataset_bytes", "files",
    "link", "fs", "job_read_bytes", "stage_cpu_s", "stage_wait_s", "window_s", "sshfs_cpu_s", "host_busy",
    "host_cpu_pressure", "load1", "nice",
]  # fmt: skip


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


def vcluster(name: str, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = run_vcluster(args[0], "--name", name, *args[1:], timeout=timeout, env=client_env())
    if check and proc.returncode != 0:
        raise StudyError(
            f"scripts/vcluster {' '.join(args[:2])} failed: {(proc.stderr or proc.stdout).strip()[-400:]}"
        )
    return proc


def on_host(
    name: str, host: str, command: str, *, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`command` (sh) on a host of the cluster: login for Slurm clients, nodeNN, never here."""
    return vcluster(name, "exec", host, "--", "sh", "-c", command, check=check, timeout=timeout)


def client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def load_setup(name: str) -> dict:
    path = work_dir(name) / "setup.json"
    if not path.exists():
        raise StudyError(f"no study cluster '{name}'; start it: perf/cluster_staging.py up --name {name}")
    return json.loads(path.read_text())


def make_dataset(root: Path, total_mib: int, file_mib: int) -> None:
    root.mkdir(parents=True)
    for i in range(max(1, total_mib // file_mib)):
        (root / f"f{i:05d}.bin").write_bytes(os.urandom(file_mib << 20))
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
    make_dataset(work / "data", args.total_mib, args.file_mib)
    _tiny(work / "tiny")
    smalls = [f"--small-local={n}:{local_mib}M" for n in nodes] + [f"--small-local={storage}:16M"]
    see = seen_by_nodes([REPO, Path(sys.prefix), work])
    vcluster(args.name, "up", "--nodes", str(args.nodes + 1), "--rate", args.link, *smalls, *see)
    vcluster(args.name, "shape", storage, "--rate", args.fs)
    on_host(args.name, "login", f"scontrol update NodeName={storage} State=DRAIN Reason=storage")
    setup.update(start_storage(args.name, work, storage))
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    for node in nodes:
        mount(args.name, setup, node)
    setup["rtt_ms"] = probe_rtt(args.name, nodes[0], storage)
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    print(
        f"cluster_staging: {args.name} up: {len(nodes)} compute nodes at {args.link}, storage {storage} at {args.fs} "
        f"(sshfs at {setup['mount']}), idle RTT {setup['rtt_ms']:.3f} ms; dataset {args.total_mib} MiB in {work / 'data'}"
    )


def _tiny(root: Path) -> None:
    """One 64 KiB file: the fixed cost of a staging, with no bytes worth timing."""
    root.mkdir(parents=True)
    (root / "t.bin").write_bytes(os.urandom(64 << 10))
    subprocess.run(
        [Path(sys.executable).parent / "mlhpc", "manifest", str(root)], check=True, capture_output=True
    )


def start_storage(name: str, work: Path, storage: str) -> dict:
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
        stdout=log, stderr=log, start_new_session=True, env=client_env(),
    )  # fmt: skip
    for _ in range(50):
        if "Server listening" in (ssh / "sshd.log").read_text():
            break
        if daemon.poll() is not None:
            raise StudyError(f"sshd on {storage} exited: {(ssh / 'sshd.log').read_text()[-300:]}")
        time.sleep(0.1)
    return {"sshd_pid": daemon.pid, "made_run_sshd": made}


def ssh_options(work: str) -> str:
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


def mount(name: str, setup: dict, node: str) -> None:
    """The dataset (and the tiny one) at the same path on `node`, through its own sshfs client."""
    opts = ssh_options(setup["work"])
    for src, dest in ((setup["data"], setup["mount"]), (setup["tiny"], setup["tiny_mount"])):
        Path(dest).mkdir(exist_ok=True)
        on_host(
            name,
            node,
            f"sshfs root@{setup['storage']}:{src} {dest} -o {opts} && test -f {dest}/mlhpc_manifest.json",
        )


def probe_rtt(name: str, client: str, server: str) -> float:
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
    echo = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=client_env())
    try:
        time.sleep(1.0)
        out = vcluster(name, "exec", client, "--", sys.executable, "-c", ask).stdout
        return float(out.split()[-1])
    finally:
        echo.terminate()
        echo.wait(10)


def cmd_shape(args: argparse.Namespace) -> None:
    """New rates for the compute links and the storage link (a check at other rates: new --out)."""
    setup = load_setup(args.name)
    link, fs = bits_per_s(args.link), bits_per_s(args.fs)
    for node in setup["nodes"]:
        vcluster(args.name, "shape", node, "--rate", args.link)
    vcluster(args.name, "shape", setup["storage"], "--rate", args.fs)
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
    vcluster(args.name, "down", check=False)
    if setup.get("made_run_sshd"):
        with contextlib.suppress(OSError):  # not empty: not only ours
            Path("/run/sshd").rmdir()
    shutil.rmtree(work, ignore_errors=True)
    print(f"cluster_staging: {args.name} down")


# --- measuring ----------------------------------------------------------------------------------


def host_cpu() -> tuple[float, float, float]:
    """(busy jiffies, all jiffies) from /proc/stat, and the CPU pressure stall total (µs)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    try:
        pressure = float(Path("/proc/pressure/cpu").read_text().split("total=")[1].split()[0])
    except (OSError, IndexError):
        pressure = math.nan
    return sum(fields) - idle, sum(fields), pressure


def sshfs_cpu_s(setup: dict) -> float:
    """CPU seconds so far of the file system's processes: each node's sshfs and ssh client (their
    command lines name the study's folder) and the storage node's sshd with its children."""
    ppid: dict[int, int] = {}
    mine: set[int] = set()
    ticks: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(stat.parent.name)
        rest = text.rsplit(")", 1)[1].split()
        ppid[pid] = int(rest[1])
        ticks[pid] = float(rest[11]) + float(rest[12])
        if setup["work"].encode() in cmdline and (b"ssh" in cmdline):
            mine.add(pid)
    root = setup.get("sshd_pid")
    grew = True
    while grew:  # the sshd's session children (their command lines are rewritten)
        grew = False
        for pid, parent in ppid.items():
            if pid not in mine and (parent in mine or parent == root):
                mine.add(pid)
                grew = True
    return sum(ticks.get(p, 0.0) for p in mine) / os.sysconf("SC_CLK_TCK")


STAGED = re.compile(
    r"staged (\d+) files, (\d+) bytes to \S+ in ([\d.]+) s \(.*mode (\w+), (\d+) node.*the job read (\d+) source bytes"
)


def run_point(setup: dict, nodes: int, mode: str, *, tiny: bool = False, nice: int = 0) -> dict:
    """One `srun -N nodes mlhpc stage` from the login host; each task under `task` (CPU use)."""
    name, hosts = setup["name"], setup["nodes"][:nodes]
    src = setup["tiny_mount"] if tiny else setup["mount"]
    dest = f"/local/cs-{uuid.uuid4().hex[:8]}"
    task = f"nice -n {nice} {sys.executable} {Path(__file__).resolve()} task --dest {dest} -- mlhpc stage {src} {dest} --mode {mode}"
    script = f"{task}; rc=$?; rm -rf {dest}; exit $rc"
    command = (
        f"srun -N {nodes} -w {','.join(hosts)} --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c '{script}'"
    )
    before, fs_before, t0 = host_cpu(), sshfs_cpu_s(setup), time.perf_counter()
    load1 = os.getloadavg()[0]
    proc = on_host(name, "login", command, check=False, timeout=590)
    wall, after, fs_after = time.perf_counter() - t0, host_cpu(), sshfs_cpu_s(setup)
    match = STAGED.search(proc.stdout)
    stats = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("CSTAT ")]
    if proc.returncode != 0 or match is None or len(stats) != nodes:
        raise StudyError(
            f"srun -N {nodes} mlhpc stage --mode {mode} failed (rc {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        )
    if (match.group(4), int(match.group(5))) != (mode, nodes):
        raise StudyError(
            f"staged in mode {match.group(4)} on {match.group(5)} nodes, asked {mode} on {nodes}"
        )
    jiffies = after[1] - before[1]
    return {
        "nodes": nodes,
        "mode": mode,
        "stage_s": float(match.group(3)),
        "wall_s": round(wall, 3),
        "files": int(match.group(1)),
        "job_read_bytes": int(match.group(6)),
        "stage_cpu_s": round(sum(s["cpu_s"] for s in stats), 3),
        "stage_wait_s": round(sum(s["wait_s"] for s in stats), 3),
        "window_s": round(max(s["window_s"] for s in stats), 3),
        "sshfs_cpu_s": round(fs_after - fs_before, 3),
        "host_busy": round((after[0] - before[0]) / jiffies, 3) if jiffies else math.nan,
        "host_cpu_pressure": round((after[2] - before[2]) / 1e6 / wall, 3),
        "load1": round(load1, 2),
    }


def cmd_allgather(args: argparse.Namespace) -> None:
    """The exchange's all-gather alone (mlhpc's own communicator, its chunk and header), per
    node count: the rate at which it brings each node the other nodes' chunks."""
    setup = load_setup(args.name)
    out = Path(args.out) / "cluster_staging.csv"
    for n in [int(x) for x in args.nodes.split(",")]:
        hosts = ",".join(setup["nodes"][:n])
        task = f"nice -n {args.nice} {sys.executable} {Path(__file__).resolve()} gather-task --repeats {args.repeats}"
        proc = on_host(
            setup["name"],
            "login",
            f"srun -N {n} -w {hosts} --ntasks-per-node=1 {task}",
            check=False,
            timeout=590,
        )
        seconds = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("GATHER ")]
        if proc.returncode != 0 or len(seconds) != args.repeats:
            raise StudyError(f"all-gather on {n} nodes failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
        stride = chunk_size(DEFAULT_CHUNK_BYTES, n) + HEADER_BYTES
        rows = [
            {
                "date": datetime.date.today().isoformat(),
                "commit": commit(),
                "nodes": n,
                "mode": "allgather",
                "repeat": r,
                "stage_s": t,
                "dataset_bytes": (n - 1) * stride,
                "link": setup["link"],
                "fs": setup["fs"],
                "nice": args.nice,
            }
            for r, t in enumerate(seconds)
        ]
        append_rows(out, rows)
        rate = (n - 1) * stride / statistics.median(seconds) / 1e6
        print(
            f"{n} nodes: all-gather of {stride} B per node in {statistics.median(seconds):.2f} s: {rate:.2f} MB/s in"
        )


def cmd_gather_task(args: argparse.Namespace) -> None:
    """On each node under srun: time the exchange's all-gather (rank 0 prints)."""
    from mlhpc.staging import make_comm

    comm = make_comm("torch")
    try:
        n = comm.topology.num_nodes
        stride = chunk_size(DEFAULT_CHUNK_BYTES, n) + HEADER_BYTES
        send, received = bytearray(stride), bytearray(n * stride)
        for r in range(args.repeats + 1):  # the first one sets up the pairs' connections
            started = time.perf_counter()
            comm.peer_allgather(memoryview(send), memoryview(received))
            if r and comm.rank == 0:
                print(f"GATHER {time.perf_counter() - started:.3f}", flush=True)
    finally:
        comm.close()


def cmd_task(args: argparse.Namespace) -> None:
    """Run one stage process (on a node, under srun) and print what its threads, and its worker
    processes' threads, did (/proc/PID/task/*/schedstat): CPU time, and time spent runnable but
    waiting for a CPU. Counted over the staging window, from DEST's appearance (the stage takes
    DEST's lock first) to its marker, so the imports and the process group's start stay out."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    dest = Path(args.dest)
    child = subprocess.Popen(command)
    seen: dict[tuple[int, int], tuple[float, float]] = {}
    start: dict[tuple[int, int], tuple[float, float]] | None = None
    end: dict[tuple[int, int], tuple[float, float]] | None = None
    opened = closed = math.nan
    while child.poll() is None:
        seen.update(thread_times(child.pid))
        now = time.perf_counter()
        if start is None and dest.exists():
            start, opened = dict(seen), now
        if start is not None and end is None and (dest / ".mlhpc_staged.json").exists():
            end, closed = dict(seen), now
        time.sleep(0.1)
    start, end = start or {}, end or seen

    def spent(i: int) -> float:
        return sum(v[i] - start.get(k, (0.0, 0.0))[i] for k, v in end.items()) / 1e9

    print(
        "CSTAT "
        + json.dumps(
            {
                "host": os.uname().nodename,
                "window_s": round(closed - opened, 3),
                "cpu_s": round(spent(0), 3),
                "wait_s": round(spent(1), 3),
                "rc": child.returncode,
            }
        ),
        flush=True,
    )
    sys.exit(child.returncode)


def thread_times(pid: int) -> dict[tuple[int, int], tuple[float, float]]:
    """(CPU ns, runnable-waiting ns) of every thread of `pid` and of its descendants."""
    out = {}
    for proc in [pid, *children_of(pid)]:
        for task in Path(f"/proc/{proc}/task").glob("*"):
            try:
                run_ns, wait_ns = (float(x) for x in (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            out[(proc, int(task.name))] = (run_ns, wait_ns)
    return out


def children_of(parent: int) -> list[int]:
    """All descendants of `parent` (worker processes of a stage)."""
    ppid: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], {parent}
    while frontier:
        frontier = {p for p, pp in ppid.items() if pp in frontier}
        found += frontier
    return found


def commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def append_rows(path: Path, rows: list[dict]) -> None:
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in COLUMNS})


def dataset_sizes(setup: dict) -> list[int]:
    manifest = json.loads((Path(setup["data"]) / "mlhpc_manifest.json").read_text())
    return [f["size"] for f in manifest["files"]]


def cmd_measure(args: argparse.Namespace, *, tiny: bool = False) -> None:
    setup = load_setup(args.name)
    counts = [int(x) for x in args.nodes.split(",")]
    modes = ["copy"] if tiny else args.modes.split(",")
    for n in counts:
        if not 1 <= n <= len(setup["nodes"]):
            raise StudyError(f"--nodes {n}: the study cluster has 1 to {len(setup['nodes'])} compute nodes")
    total = sum(dataset_sizes(setup))
    out = Path(args.out) / "cluster_staging.csv"
    for n in counts:
        for r in range(args.repeats):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # each mode first in turn
                row = run_point(setup, n, mode, tiny=tiny, nice=args.nice)
                row.update(
                    date=datetime.date.today().isoformat(), commit=commit(), repeat=r,
                    dataset_bytes=64 << 10 if tiny else total, link=setup["link"], fs=setup["fs"], nice=args.nice,
                )  # fmt: skip
                if tiny:
                    row["mode"] = "tiny"
                append_rows(out, [row])
                print(
                    f"{n} node(s) {row['mode']:<9} repeat {r}: {row['stage_s']:.2f} s staging ({row['wall_s']:.1f} s srun); "
                    f"stage CPU {row['stage_cpu_s']:.1f} s, waited {row['stage_wait_s']:.1f} s; sshfs CPU {row['sshfs_cpu_s']:.1f} s; "
                    f"machine busy {row['host_busy']:.0%}, CPU pressure {row['host_cpu_pressure']:.0%}",
                    flush=True,
                )


# --- the report ---------------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        raise StudyError(f"{path} not found: run perf/cluster_staging.py measure first")
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class Point:
    median: float
    low: float
    high: float
    count: int


def summarize(rows: list[dict]) -> dict[tuple[int, str], Point]:
    groups: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        groups.setdefault((int(row["nodes"]), row["mode"]), []).append(float(row["stage_s"]))
    return {k: Point(statistics.median(v), min(v), max(v), len(v)) for k, v in groups.items()}


@dataclass(frozen=True)
class Findings:
    table: str
    """Markdown: nodes x mode, the measured median (min-max) beside the model's seconds."""
    measured: float | None
    """The measured crossover copy/replicate (nodes)."""
    predicted: float | None
    """The model's, from the shaped rates alone."""
    predicted_gather: float | None
    """The model's, with the exchange's all-gather at its measured rate."""


def report(rows: list[dict], sizes: Sequence[int], setup: Setup) -> Findings:
    """The table and the crossovers; `setup` carries the measured all-gather rates, if any."""
    links = dataclasses.replace(setup, allgather_bytes_s=())
    points = summarize(rows)
    counts = sorted({n for n, m in points if m in MODES})
    lines = [
        "| nodes | copy | model | replicate | model | model, measured all-gather | shard | model |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in counts:
        cells = []
        for m in MODES:
            p = points.get((n, m))
            cells.append(f"{p.median:.1f} ({p.low:.1f}-{p.high:.1f})" if p else "-")
            cells.append(f"{model_seconds(m, n, sizes, links):.1f}")
            if m == "replicate":
                cells.append(f"{model_seconds(m, n, sizes, setup):.1f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    both = [n for n in counts if (n, "copy") in points and (n, "replicate") in points]
    largest = max(both, default=1)
    return Findings(
        "\n".join(lines),
        crossover(
            both, [points[n, "copy"].median for n in both], [points[n, "replicate"].median for n in both]
        ),
        model_crossover(sizes, links, largest),
        model_crossover(sizes, setup, largest),
    )


def allgather_table(setup: Setup) -> str:
    lines = ["| nodes | all-gather, MB/s into each node | of the link's payload rate |", "|---:|---:|---:|"]
    for n, rate in setup.allgather_bytes_s:
        lines.append(f"| {n} | {rate / 1e6:.2f} | {rate / setup.link_bytes_s:.0%} |")
    return "\n".join(lines)


def cpu_table(rows: list[dict]) -> str:
    """Per node count and mode (medians over the repeats), per second of staging: CPU the stage
    processes used (all nodes together) and the threads that waited for a CPU while runnable (on
    average), CPU of the file system's processes (sshfs, ssh, sshd), and the whole machine."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        if row["mode"] in MODES:
            groups.setdefault((int(row["nodes"]), row["mode"]), []).append(row)
    lines = [
        "| nodes | mode | stage CPU (cores) | threads waiting for a CPU | sshfs+sshd CPU (cores) "
        "| machine busy | CPU pressure |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (n, m), group in sorted(groups.items()):
        per_s = [_median(group, key, per_s=True) for key in ("stage_cpu_s", "stage_wait_s", "sshfs_cpu_s")]
        busy, pressure = _median(group, "host_busy"), _median(group, "host_cpu_pressure")
        lines.append(
            f"| {n} | {m} | " + " | ".join(f"{x:.2f}" for x in per_s) + f" | {busy:.0%} | {pressure:.0%} |"
        )
    return "\n".join(lines)


def _median(rows: list[dict], key: str, *, per_s: bool = False) -> float:
    return statistics.median(float(r[key]) / (float(r["stage_s"]) if per_s else 1.0) for r in rows)


def plot(
    rows: list[dict],
    sizes: Sequence[int],
    setup: Setup,
    png: Path,
    found: Findings,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = summarize(rows)
    counts = sorted({n for n, m in points if m in MODES})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"copy": "tab:red", "replicate": "tab:blue", "shard": "tab:green"}
    labels = {
        "copy": "copy (every node reads)",
        "replicate": "replicate (read once, all-gather)",
        "shard": "shard",
    }
    grid = list(range(1, max(counts) + 1))
    for m in MODES:
        have = [n for n in counts if (n, m) in points]
        med = [points[n, m].median for n in have]
        err = [
            [points[n, m].median - points[n, m].low for n in have],
            [points[n, m].high - points[n, m].median for n in have],
        ]
        ax.errorbar(have, med, yerr=err, fmt="o", color=colors[m], capsize=3, label=f"{labels[m]}, measured")
        links = dataclasses.replace(setup, allgather_bytes_s=())
        model = [model_seconds(m, n, sizes, links) for n in grid]
        ax.plot(grid, model, "--", color=colors[m], alpha=0.8, label=f"{m}: model (shaped rates)")
        if m == "replicate" and setup.allgather_bytes_s:
            gathered = [model_seconds(m, n, sizes, setup) for n in grid]
            ax.plot(grid, gathered, ":", color=colors[m], label=f"{m}: model, all-gather as measured")
    _decorate(ax, setup, sizes, grid, found)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def _decorate(ax: Any, setup: Setup, sizes: Sequence[int], grid: list[int], found: Findings) -> None:
    """The plot's crossover lines, axes, title and legend."""
    if found.measured:
        ax.axvline(found.measured, color="0.2", lw=1, label=f"crossover measured: {found.measured:.2f} nodes")
    if found.predicted:
        ax.axvline(
            found.predicted, color="0.5", lw=1, ls="--", label=f"crossover model: {found.predicted:.2f}"
        )
    ax.set_xlabel("nodes")
    ax.set_ylabel("staging time (s, rank 0's stage_dataset)")
    ax.set_xticks(grid)
    ax.set_ylim(bottom=0)
    total_mib = sum(sizes) / 2**20
    ax.set_title(
        f"{total_mib:.0f} MiB onto each node's /local: links {setup.link_bit_s / 1e6:.0f} Mbit/s, "
        f"shared FS {setup.fs_bit_s / 1e6:.0f} Mbit/s",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left")


def setup_from_rows(rows: list[dict]) -> Setup:
    """The setup the rows were measured with: the shaped rates, t0 (the median tiny staging on
    one node) and the all-gather's rate per node count (median over its repeats)."""
    tiny = [float(r["stage_s"]) for r in rows if r["mode"] == "tiny" and r["nodes"] == "1"]
    link = {r["link"] for r in rows if r["mode"] in MODES}
    fs = {r["fs"] for r in rows if r["mode"] in MODES}
    if len(link) != 1 or len(fs) != 1:
        raise StudyError(
            f"the CSV mixes link rates {sorted(link)} or file-system rates {sorted(fs)}: one setup a CSV"
        )
    gathers: dict[int, list[float]] = {}
    for r in rows:
        if r["mode"] == "allgather":
            gathers.setdefault(int(r["nodes"]), []).append(int(r["dataset_bytes"]) / float(r["stage_s"]))
    return Setup(
        link_bit_s=bits_per_s(link.pop()),
        fs_bit_s=bits_per_s(fs.pop()),
        overhead_s=statistics.median(tiny) if tiny else 0.0,
        allgather_bytes_s=tuple(sorted((n, statistics.median(v)) for n, v in gathers.items())),
    )


def cmd_report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rows = read_rows(out / "cluster_staging.csv")
    setup = setup_from_rows(rows)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else dataset_sizes(load_setup(args.name))
    found = report(rows, sizes, setup)

    def nodes(x: float | None, compare: bool = True) -> str:
        if x is None:
            return "none"
        apart = abs(x - found.measured) / found.measured if found.measured and compare else None
        return f"{x:.2f} nodes" + (f" ({apart:.0%} from the measured)" if apart is not None else "")

    text = (
        f"{found.table}\n\nSeconds: rank 0's staging time, median (min-max) of the repeats; t0 (tiny dataset, "
        f"1 node) = {setup.overhead_s:.2f} s.\n\nCrossover copy/replicate: measured {nodes(found.measured, False)}; "
        f"model {nodes(found.predicted)}; model with the measured all-gather {nodes(found.predicted_gather)}.\n\n"
        f"{allgather_table(setup)}\n\n{cpu_table(rows)}\n"
    )
    (out / "cluster_staging.md").write_text(text)
    png = Path(args.png) if args.png else out / "cluster_staging.png"
    plot(rows, sizes, setup, png, found)
    print(text)


def cmd_model(args: argparse.Namespace) -> None:
    setup = Setup(link_bit_s=bits_per_s(args.link), fs_bit_s=bits_per_s(args.fs), overhead_s=args.overhead_s)
    sizes = [args.file_mib << 20] * max(1, args.total_mib // args.file_mib)
    print("| nodes | " + " | ".join(MODES) + " |\n|---:|" + "---:|" * len(MODES))
    for n in [int(x) for x in args.nodes.split(",")]:
        print(f"| {n} | " + " | ".join(f"{model_seconds(m, n, sizes, setup):.1f}" for m in MODES) + " |")
    cross = model_crossover(sizes, setup)
    print(f"crossover copy/replicate: {cross if cross is None else f'{cross:.2f}'} nodes")


def _add_hidden(sub: Any) -> None:
    """The commands the study runs on the nodes itself (srun), not shown in --help."""
    gt = sub.add_parser("gather-task", help=argparse.SUPPRESS)
    gt.add_argument("--repeats", type=int, default=3)
    ta = sub.add_parser("task", help=argparse.SUPPRESS)
    ta.add_argument("--dest", required=True, help="the stage's DEST: its window opens when DEST appears")
    ta.add_argument("command", nargs=argparse.REMAINDER)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perf/cluster_staging.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def named(cmd: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(cmd, help=help)
        s.add_argument("--name", default="cstage", help="the study cluster's name (cstage)")
        s.add_argument("--out", default="runs/cluster-staging", help="CSV, table and plot")
        s.add_argument(
            "--nice", type=int, default=0, help="niceness of the stage processes (measure, calibrate)"
        )
        return s

    up = named("up", "start the cluster with its storage node and mounts, make the dataset")
    up.add_argument("--nodes", type=int, default=8, help="compute nodes (8)")
    up.add_argument("--link", default="50mbit", help="each compute node's link (50mbit)")
    up.add_argument("--fs", default="150mbit", help="the storage node's link: the shared FS (150mbit)")
    up.add_argument("--total-mib", type=int, default=128, help="dataset size (128)")
    up.add_argument("--file-mib", type=int, default=2, help="file size (2)")
    ca = named("calibrate", "measure t0, the fixed cost of one staging (a 64 KiB dataset, 1 node)")
    ca.add_argument("--repeats", type=int, default=5)
    ca.add_argument("--nodes", default="1", help="node counts (1; the model takes t0 from 1 node)")
    me = named("measure", "stage at the given node counts, append to the CSV")
    me.add_argument("--nodes", required=True, help="node counts, e.g. 1,2")
    me.add_argument("--modes", default=",".join(MODES))
    me.add_argument("--repeats", type=int, default=3)
    re_ = named("report", "table, crossover and plot from the CSV")
    re_.add_argument("--png", help="where the plot goes (default OUT/cluster_staging.png)")
    re_.add_argument(
        "--sizes", help="file sizes in bytes, comma-separated (default: the study cluster's dataset)"
    )
    mo = named("model", "print the model's staging times and crossover")
    mo.add_argument("--nodes", default="1,2,3,4,6,8")
    mo.add_argument("--link", default="50mbit")
    mo.add_argument("--fs", default="150mbit")
    mo.add_argument("--total-mib", type=int, default=128)
    mo.add_argument("--file-mib", type=int, default=2)
    mo.add_argument("--overhead-s", type=float, default=0.0)
    sh = named("shape", "reshape the compute links and the storage link")
    sh.add_argument("--link", required=True)
    sh.add_argument("--fs", required=True)
    named("down", "unmount, stop the storage node's sshd, take the cluster down")
    ag = named("allgather", "time the exchange's all-gather alone at the given node counts")
    ag.add_argument("--nodes", default="2,3,4,5,6,7,8")
    ag.add_argument("--repeats", type=int, default=3)
    _add_hidden(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "task":
            cmd_task(args)
        elif args.cmd == "gather-task":
            cmd_gather_task(args)
        elif args.cmd == "calibrate":
            cmd_measure(args, tiny=True)
        else:
            {
                "up": cmd_up,
                "measure": cmd_measure,
                "report": cmd_report,
                "model": cmd_model,
                "shape": cmd_shape,
                "allgather": cmd_allgather,
                "down": cmd_down,
            }[args.cmd](args)
    except StudyError as e:
        print(f"cluster_staging: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
