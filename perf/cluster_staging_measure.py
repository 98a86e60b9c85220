"""perf/cluster_staging.py's measurements: `srun -N n mlhpc stage` per mode and node count, the
exchange's all-gather alone, the CPU each took; one CSV row per run."""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cluster_staging_cluster import REPO, TINY_BYTES, StudyError, load_setup, on_host

from mlhpc.study.model import gather_stride

COLUMNS = [
    "date", "commit", "nodes", "mode", "repeat", "stage_s", "wall_s", "dataset_bytes", "files",
    "link", "fs", "job_read_bytes", "stage_cpu_s", "stage_wait_s", "window_s", "sshfs_cpu_s", "host_busy",
    "host_cpu_pressure", "load1", "nice",
]  # fmt: skip


# --- measuring ----------------------------------------------------------------------------------


def _host_cpu() -> tuple[float, float, float]:
    """(busy jiffies, all jiffies) from /proc/stat, and the CPU pressure stall total (µs)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    try:
        pressure = float(Path("/proc/pressure/cpu").read_text().split("total=")[1].split()[0])
    except (OSError, IndexError):
        pressure = math.nan
    return sum(fields) - idle, sum(fields), pressure


def _sshfs_cpu_s(setup: dict) -> float:
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


_SCRIPT = Path(__file__).resolve().with_name("cluster_staging.py")
"""The study's command: each task on a node runs its `task` or `gather-task`."""
_STAGED = re.compile(
    r"staged (\d+) files, (\d+) bytes to \S+ in ([\d.]+) s \(.*mode (\w+), (\d+) node.*the job read (\d+) source bytes"
)


def _run_point(setup: dict, nodes: int, mode: str, *, tiny: bool = False, nice: int = 0) -> dict:
    """One `srun -N nodes mlhpc stage` from the login host; each task under `task` (CPU use)."""
    name, hosts = setup["name"], setup["nodes"][:nodes]
    src = setup["tiny_mount"] if tiny else setup["mount"]
    dest = f"/local/cs-{uuid.uuid4().hex[:8]}"
    task = f"nice -n {nice} {sys.executable} {_SCRIPT} task --dest {dest} -- mlhpc stage {src} {dest} --mode {mode}"
    script = f"{task}; rc=$?; rm -rf {dest}; exit $rc"
    command = (
        f"srun -N {nodes} -w {','.join(hosts)} --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c '{script}'"
    )
    before, fs_before, t0 = _host_cpu(), _sshfs_cpu_s(setup), time.perf_counter()
    load1 = os.getloadavg()[0]
    proc = on_host(name, "login", command, check=False, timeout=590)
    wall, after, fs_after = time.perf_counter() - t0, _host_cpu(), _sshfs_cpu_s(setup)
    match = _STAGED.search(proc.stdout)
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
        task = f"nice -n {args.nice} {sys.executable} {_SCRIPT} gather-task --repeats {args.repeats}"
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
        stride = gather_stride(n)
        rows = [
            {
                "date": datetime.date.today().isoformat(),
                "commit": _commit(),
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
        _append_rows(out, rows)
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
        stride = gather_stride(n)
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
        seen.update(_thread_times(child.pid))
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


def _thread_times(pid: int) -> dict[tuple[int, int], tuple[float, float]]:
    """(CPU ns, runnable-waiting ns) of every thread of `pid` and of its descendants."""
    out = {}
    for proc in [pid, *_children_of(pid)]:
        for task in Path(f"/proc/{proc}/task").glob("*"):
            try:
                run_ns, wait_ns = (float(x) for x in (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            out[(proc, int(task.name))] = (run_ns, wait_ns)
    return out


def _children_of(parent: int) -> list[int]:
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


def _commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def _append_rows(path: Path, rows: list[dict]) -> None:
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
                row = _run_point(setup, n, mode, tiny=tiny, nice=args.nice)
                row.update(
                    date=datetime.date.today().isoformat(), commit=_commit(), repeat=r,
                    dataset_bytes=TINY_BYTES if tiny else total, link=setup["link"], fs=setup["fs"], nice=args.nice,
                )  # fmt: skip
                if tiny:
                    row["mode"] = "tiny"
                _append_rows(out, [row])
                print(
                    f"{n} node(s) {row['mode']:<9} repeat {r}: {row['stage_s']:.2f} s staging ({row['wall_s']:.1f} s srun); "
                    f"stage CPU {row['stage_cpu_s']:.1f} s, waited {row['stage_wait_s']:.1f} s; sshfs CPU {row['sshfs_cpu_s']:.1f} s; "
                    f"machine busy {row['host_busy']:.0%}, CPU pressure {row['host_cpu_pressure']:.0%}",
                    flush=True,
                )
