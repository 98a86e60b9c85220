#!/usr/bin/env python3
"""Time-to-train by staging mode on the virtual cluster (scripts/vcluster): `srun -N n mlhpc run
BENCH --config mini --staging MODE` at 1, 2 and 4 nodes, the modes interleaved (A B C A B C ...),
with the shared file system behind a shaped link so that staging costs what it does on a real one.

The cluster is perf/cluster_staging.py's: N compute nodes and one more host, the storage node
(drained in Slurm), which serves the dataset over sshfs; each compute node mounts it at the same
path in its own mount namespace. Only the storage node's link is shaped (tc tbf, both directions,
--rate); the compute nodes' links, which carry DDP's all-reduce and staging's exchange, are not.
`mlhpc run` stages in replicate mode (the dataset read once in all, then exchanged), so staging
time grows only mildly with the node count (cosmoflow mini at 60mbit: 6 s at 1 node, 8 at 2, 11
at 4). At 55mbit `--staging inside` spends about 25 % of time-to-train staging on an idle machine
(`calibrate`; a loaded one trains slower, and the share falls). /local is a tmpfs on every node; each run stages to a fresh folder
there, removed after it. Every client runs inside the cluster (`scripts/vcluster exec login --
srun ...`), never in the host's network namespace.

    perf/overlap_vcluster.py calibrate [--rates 50mbit,60mbit] [--nodes 1,2]   # staging share of --staging inside
    perf/overlap_vcluster.py sweep [--rate 55mbit] [--nodes 1,2,4] [--modes inside,before,overlap] [--repeats 3]
    perf/overlap_vcluster.py down                        # only after --keep, or an interrupted command

Each command brings the cluster up (generating the dataset) and takes it down at its end, unless
--keep; a later command with the same --name reuses a kept cluster. Run as root. Results go to
--out (default runs/overlap-vcluster): overlap_<time>.json (every run's figures, the machine, the
command, the git revision), .md (the table) and .png (the plot); perf/overlap_report.py prints
the table of one or more JSON files again.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from cluster_staging_cluster import (
    REPO,
    StudyError,
    _client_env,
    _ssh_options,
    _start_storage,
    _vcluster,
    bits_per_s,
    on_host,
    seen_by_nodes,
)
from overlap_report import ReportError, RunFigures, aggregate, plot, read_run, table

MLHPC = Path(sys.executable).parent / "mlhpc"
LOCAL_TMPFS = "512M"
"""Each compute node's /local: two staged copies of the mini datasets (43 MB for cosmoflow) fit."""


def work_dir(name: str) -> Path:
    """On the host's disk, which every host of the cluster sees (each node has its own /tmp)."""
    return Path(os.environ.get("OVERLAP_WORK", "/var/tmp")) / f"mlhpc-overlap-{name}"


# --- the cluster --------------------------------------------------------------------------------


def _generate(args: argparse.Namespace, data: Path) -> None:
    """The benchmark's synthetic dataset with its manifest, after a look at the free space."""
    from mlhpc.common.contract import registry
    from mlhpc.common.contract.config import load_config
    from mlhpc.dataset_size import dataset_bytes, human_size

    bench = registry.get(args.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(args.config), list(args.set))
    size = dataset_bytes(args.benchmark, cfg) or 0
    free = shutil.disk_usage(data.parent).free
    if size > 4 << 30 or free < size + (2 << 30):
        raise StudyError(
            f"the {args.benchmark} {args.config} dataset is {human_size(size)} and {data.parent} has "
            f"{human_size(free)} free: keep it under 4 GiB with 2 GiB to spare (--set data.num_train_samples=...)"
        )
    proc = subprocess.run(
        [MLHPC, "generate", args.benchmark, "--config", args.config, "--out", str(data), *args.set],
        capture_output=True, text=True, env=_client_env(),
    )  # fmt: skip
    if proc.returncode != 0:
        raise StudyError(f"mlhpc generate failed: {(proc.stderr or proc.stdout).strip()[-400:]}")


def cluster_up(args: argparse.Namespace, nodes: int) -> dict:
    """`nodes` compute nodes, unshaped, and a storage node at --rate serving the dataset."""
    if os.geteuid() != 0:
        raise StudyError("perf/overlap_vcluster.py needs root (scripts/vcluster does); run it as root")
    for tool in ("sshfs", "fusermount3", "/usr/sbin/sshd", "ssh-keygen", "srun"):
        if shutil.which(tool) is None:
            raise StudyError(f"{tool} not found: apt-get install -y openssh-server sshfs slurm-wlm munge")
    work = work_dir(args.name)
    if work.exists():
        raise StudyError(
            f"{work} exists: a cluster is left over; perf/overlap_vcluster.py down --name {args.name}"
        )
    work.mkdir(parents=True)
    names = [f"node{i:02d}" for i in range(1, nodes + 1)]
    storage = f"node{nodes + 1:02d}"
    setup = {
        "name": args.name, "nodes": names, "storage": storage, "work": str(work), "data": str(work / "data"),
        "mount": str(work / "mnt"), "benchmark": args.benchmark, "config": args.config, "set": list(args.set),
    }  # fmt: skip
    _save(setup)
    _generate(args, work / "data")
    smalls = [f"--small-local={n}:{LOCAL_TMPFS}" for n in names] + [f"--small-local={storage}:16M"]
    see = seen_by_nodes([REPO, Path(sys.prefix), work, Path(args.out).resolve()])
    _vcluster(args.name, "up", "--nodes", str(nodes + 1), *smalls, *see)
    on_host(args.name, "login", f"scontrol update NodeName={storage} State=DRAIN Reason=storage")
    setup.update(_start_storage(args.name, work, storage))
    _save(setup)
    Path(setup["mount"]).mkdir()
    for node in names:
        on_host(
            args.name, node,
            f"sshfs root@{storage}:{setup['data']} {setup['mount']} -o {_ssh_options(setup['work'])} "
            f"&& test -f {setup['mount']}/mlhpc_manifest.json",
        )  # fmt: skip
    manifest = json.loads((work / "data" / "mlhpc_manifest.json").read_text())
    setup["dataset_files"] = len(manifest["files"])
    setup["dataset_bytes"] = sum(f["size"] for f in manifest["files"])
    _save(setup)
    print(
        f"overlap_vcluster: {args.name} up: {nodes} compute nodes, storage {storage}; {args.benchmark} "
        f"{args.config}: {setup['dataset_files']} files, {setup['dataset_bytes'] / 1e6:.1f} MB over sshfs",
        flush=True,
    )
    return setup


def _save(setup: dict) -> None:
    (Path(setup["work"]) / "setup.json").write_text(json.dumps(setup, indent=1))


def shape(setup: dict, rate: str) -> None:
    """The storage node's link (the shared file system's) to `rate`, both directions."""
    bits_per_s(rate)
    _vcluster(setup["name"], "shape", setup["storage"], "--rate", rate)
    setup["rate"] = rate
    _save(setup)


def cluster_down(name: str) -> None:
    """Unmount, stop the storage node's sshd, take the cluster down, remove the work folder."""
    work = work_dir(name)
    setup = json.loads((work / "setup.json").read_text()) if (work / "setup.json").exists() else {}
    for node in setup.get("nodes", []):
        on_host(name, node, f"fusermount3 -u {setup['mount']} 2>/dev/null || true", check=False, timeout=30)
    if pid := setup.get("sshd_pid"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    _vcluster(name, "down", check=False)
    if setup.get("made_run_sshd"):
        with contextlib.suppress(OSError):  # not empty: not only ours
            Path("/run/sshd").rmdir()
    shutil.rmtree(work, ignore_errors=True)
    print(f"overlap_vcluster: {name} down", flush=True)


@contextlib.contextmanager
def cluster(args: argparse.Namespace, nodes: int) -> Iterator[dict]:
    """A kept cluster of this name with enough nodes and the same dataset, or a new one (taken
    down at the end unless --keep)."""
    path = work_dir(args.name) / "setup.json"
    kept = json.loads(path.read_text()) if path.exists() else None
    if kept is not None:
        same = (kept.get("benchmark"), kept.get("config"), kept.get("set")) == (
            args.benchmark,
            args.config,
            list(args.set),
        )
        if len(kept["nodes"]) < nodes or not same or "dataset_bytes" not in kept:
            raise StudyError(
                f"cluster '{args.name}' is up with {len(kept['nodes'])} nodes and {kept.get('benchmark')} "
                f"{kept.get('config')} {kept.get('set')}: take it down (perf/overlap_vcluster.py down --name {args.name}) "
                "or pick another --name"
            )
    setup = kept
    try:
        setup = setup or cluster_up(args, nodes)
        yield setup
    finally:
        if not args.keep:
            cluster_down(args.name)


# --- one run ------------------------------------------------------------------------------------


def run_once(setup: dict, args: argparse.Namespace, nodes: int, mode: str, repeat: int) -> RunFigures:
    """One `srun -N nodes mlhpc run` from the login host, staging to a fresh /local folder."""
    tag = f"n{nodes}-{mode}-r{repeat}-{uuid.uuid4().hex[:6]}"
    out = Path(args.out).resolve() / "runs" / tag  # kept with the JSON: its `log` paths point here
    out.mkdir(parents=True)
    dest = f"/local/ovl-{tag}"
    argv = [
        str(MLHPC), "run", args.benchmark, "--config", args.config, "--seeds", "1", "--first-seed", str(args.seed),
        "--out", str(out), "--data", setup["mount"], "--local-dir", dest, "--staging", mode, "--no-check",
        *args.extra, *args.set,
    ]  # fmt: skip
    script = f"{shlex.join(argv)}; rc=$?; rm -rf {dest}; exit $rc"
    hosts = ",".join(setup["nodes"][:nodes])
    command = (
        f"srun -N {nodes} -w {hosts} --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c {shlex.quote(script)}"
    )
    started = time.perf_counter()
    proc = on_host(setup["name"], "login", command, check=False, timeout=args.run_timeout)
    wall = time.perf_counter() - started
    (out / "srun.log").write_text(f"$ {command}\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    logs = sorted(out.glob(f"mlhpc/results/*/strong/{args.benchmark}/result_0.txt"))
    if proc.returncode != 0 or not logs:
        raise StudyError(
            f"srun -N {nodes} mlhpc run --staging {mode} failed (rc {proc.returncode}; {out / 'srun.log'}): "
            f"{(proc.stderr or proc.stdout).strip()[-600:]}"
        )
    return read_run(logs[0], nodes=nodes, mode=mode, repeat=repeat, wall_s=round(wall, 2))


def _say(run: RunFigures) -> None:
    share = "-" if run.staging_share is None else f"{run.staging_share:.0%}"
    print(
        f"{run.nodes} node(s) {run.mode:<8} repeat {run.repeat}: time-to-train {run.ttt_s:.1f} s, staging "
        f"{run.staging_s or 0:.1f} s ({share}, from run_start {run.staging_from_run_start_s or 0:+.1f} s), "
        f"{run.epochs} epochs, {run.status}; srun {run.wall_s:.0f} s",
        flush=True,
    )


# --- the record ---------------------------------------------------------------------------------


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def _machine() -> dict:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "python": platform.python_version(),
        "load1_at_start": os.getloadavg()[0],
    }  # fmt: skip


class Record:
    """The JSON of one command: its settings and every run so far, rewritten after each run."""

    def __init__(self, args: argparse.Namespace, setup: dict) -> None:
        stamp = datetime.datetime.now(datetime.timezone.utc)
        self.path = Path(args.out) / f"overlap_{args.cmd}_{stamp:%Y%m%dT%H%M%SZ}.json"
        self.head = {
            "date": stamp.isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "git": {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))},
            "machine": _machine(),
            "benchmark": args.benchmark, "config": args.config, "overrides": list(args.set), "seed": args.seed,
            "dataset": {"files": setup["dataset_files"], "bytes": setup["dataset_bytes"]},
            "storage_link": "tc tbf on the storage node's link, both directions; compute links unshaped",
        }  # fmt: skip
        self.runs: list[dict] = []

    def add(self, run: RunFigures, rate: str, load1: float) -> None:
        """`load1`: the machine's load average as the run began (other work on the cores shows)."""
        self.runs.append({**run.to_json(), "rate": rate, "load1_at_start": load1})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({**self.head, "runs": self.runs}, indent=1) + "\n")


# --- commands -----------------------------------------------------------------------------------


def _sweep(
    setup: dict, args: argparse.Namespace, rate: str, modes: list[str], record: Record
) -> list[RunFigures]:
    """For each node count: `repeats` rounds, each running every mode once, in the order given."""
    shape(setup, rate)
    print(f"overlap_vcluster: storage link {rate}", flush=True)
    runs = []
    for nodes in args.nodes:
        for repeat in range(args.repeats):
            for mode in modes:
                load1 = os.getloadavg()[0]
                run = run_once(setup, args, nodes, mode, repeat)
                record.add(run, rate, load1)
                _say(run)
                runs.append(run)
    return runs


def cmd_sweep(args: argparse.Namespace) -> None:
    from mlhpc.common.vocabulary import STAGINGS

    unknown = [m for m in args.modes if m not in STAGINGS]
    if unknown:  # before the cluster comes up: `overlap` arrives with issue 44
        raise StudyError(f"--modes {','.join(unknown)}: this mlhpc's --staging takes {', '.join(STAGINGS)}")
    with cluster(args, max(args.nodes)) as setup:
        record = Record(args, setup)
        runs = _sweep(setup, args, args.rate, args.modes, record)
    text = table(aggregate(runs, args.reference), args.reference)
    print(text, end="")
    record.path.with_suffix(".md").write_text(text)
    title = f"{args.benchmark} {args.config}, storage link {args.rate}, {args.repeats} repeat(s)"
    plot(runs, record.path.with_suffix(".png"), title)
    print(f"overlap_vcluster: {record.path} (.md, .png beside it)")


def rate_for_share(rate: str, runs: list[RunFigures], share: float) -> float:
    """The storage rate (bit/s) at which staging would be `share` of time-to-train, if staging time
    went as 1/rate and training stayed as measured: staging' = share/(1-share) x training."""
    staging = statistics.median(r.staging_s or 0.0 for r in runs)
    training = statistics.median(r.ttt_s - (r.staging_s or 0.0) for r in runs)
    return bits_per_s(rate) * staging / (share / (1 - share) * training)


def cmd_calibrate(args: argparse.Namespace) -> None:
    """--staging inside at each rate: its staging share, and the rate that would give --share."""
    with cluster(args, max(args.nodes)) as setup:
        record = Record(args, setup)
        found = {rate: _sweep(setup, args, rate, ["inside"], record) for rate in args.rates}
    print(f"| rate | nodes | time-to-train s | staging s | staging share | rate for {args.share:.0%} |")
    print("|---|---:|---:|---:|---:|---:|")
    for rate, runs in found.items():
        for nodes in args.nodes:
            mine = [r for r in runs if r.nodes == nodes and r.status == "success"]
            if not mine:
                continue
            share = statistics.median(r.staging_share or 0.0 for r in mine)
            print(
                f"| {rate} | {nodes} | {statistics.median(r.ttt_s for r in mine):.1f} "
                f"| {statistics.median(r.staging_s or 0.0 for r in mine):.1f} | {share:.0%} "
                f"| {rate_for_share(rate, mine, args.share) / 1e6:.0f}mbit |"
            )
    print(f"overlap_vcluster: {record.path}")


def _csv(kind: type) -> object:
    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x]

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perf/overlap_vcluster.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def named(cmd: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(cmd, help=help)
        s.add_argument("--name", default="ovl", help="the cluster's name (ovl)")
        if cmd == "down":
            return s
        s.add_argument("--out", default="runs/overlap-vcluster", help="JSON, table and plot")
        s.add_argument("--benchmark", default="cosmoflow")
        s.add_argument("--config", default="mini")
        s.add_argument("--seed", type=int, default=1, help="every run's seed, so epochs stay alike (1)")
        s.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a config override (generate and run)",
        )
        s.add_argument("--extra", type=shlex.split, default=[], help="more `mlhpc run` flags, one string")
        s.add_argument(
            "--nodes", type=_csv(int), default=[1, 2, 4], help="node counts (sweep: 1,2,4; calibrate: 1,2)"
        )
        s.add_argument("--repeats", type=int, default=3)
        s.add_argument("--run-timeout", type=float, default=590, help="seconds one srun may take (590)")
        s.add_argument("--keep", action="store_true", help="leave the cluster up for the next command")
        return s

    sw = named("sweep", "every mode at every node count, interleaved; table, JSON, plot")
    sw.add_argument("--rate", default="55mbit", help="the storage link's rate, tc's syntax (55mbit)")
    sw.add_argument("--modes", type=_csv(str), default=["inside", "before"], help="--staging values, in turn")
    sw.add_argument("--reference", default="before", help="the mode the ratios divide by (before)")
    ca = named("calibrate", "--staging inside at each rate: its share of time-to-train")
    ca.add_argument("--rates", type=_csv(str), default=["55mbit"], help="storage link rates to try (55mbit)")
    ca.add_argument("--share", type=float, default=0.25, help="the staging share to find a rate for (0.25)")
    ca.set_defaults(repeats=1, nodes=[1, 2])
    named("down", "take a kept cluster down")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "down":
            cluster_down(args.name)
        elif args.cmd == "calibrate":
            cmd_calibrate(args)
        else:
            cmd_sweep(args)
    except (StudyError, ReportError) as e:
        print(f"overlap_vcluster: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
