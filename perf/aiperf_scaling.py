#!/usr/bin/env python3
"""AIPerf's weak scaling on the virtual cluster (scripts/vcluster): `srun -N n --ntasks-per-node=1
mlhpc run aiperf --config mini` for the same duration at each node count, then `mlhpc check` of
each run: its trials, best top-1, final OPS, OPS per node and regulated score. With --kill, one
more run at the largest count in which one node's trial processes are killed (SIGKILL) partway:
the run must go on and score what the others and the lost node's finished epochs did.

    perf/aiperf_scaling.py [--nodes 1,2,4] [--minutes 3] [--kill] [--seed N] [--keep]

Every client runs inside the cluster (`scripts/vcluster exec login -- srun ...`), never in the
host's network namespace; the run folders and the dataset live in a folder every host sees. Root
only. Writes aiperf_scaling_<time>.json and .md under --out (default runs/aiperf-scaling).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from cluster_staging_cluster import REPO, StudyError, _vcluster, on_host

from scripts.vclusterlib.client import kill_on_node  # cluster_staging_cluster put the repo on the path

MLHPC = Path(sys.executable).parent / "mlhpc"


def _up(name: str, nodes: int) -> Path:
    _vcluster(name, "up", "--nodes", str(nodes), timeout=180)
    shared = Path(json.loads(_vcluster(name, "status", "--json").stdout)["shared"])
    if not shared.is_dir():
        raise StudyError(f"the cluster's shared folder {shared} is missing")
    return shared


def _run(name: str, work: Path, data: Path, nodes: int, minutes: float, seed: int, tag: str,
         kill_after_s: float | None = None) -> dict:
    out = work / f"run-{tag}"
    command = [
        "srun", "-N", str(nodes), "--ntasks-per-node=1", str(MLHPC), "run", "aiperf", "--config", "mini",
        "--data", str(data), "--out", str(out), "--first-seed", str(seed), "--no-check",
        f"search.duration_minutes={minutes}",
    ]
    killer = None
    if kill_after_s is not None:
        victim = f"node{nodes:02d}"
        killer = threading.Timer(kill_after_s, lambda: print(f"killed on {victim}: {kill_on_node(victim, b'aiperf')}"))
        killer.start()
    started = time.time()
    proc = on_host(name, "login", shlex.join(command), check=False, timeout=minutes * 60 + 600)
    wall = time.time() - started
    if killer is not None:
        killer.cancel()
    report = work / f"score-{tag}.json"
    checked = subprocess.run([str(MLHPC), "check", str(out), "--json", str(report)], capture_output=True,
                             text=True, timeout=300, check=False)
    if not report.exists():
        raise StudyError(f"mlhpc check {out} wrote no score: {(checked.stderr or checked.stdout)[-600:]}\n"
                         f"srun said: {(proc.stderr or proc.stdout)[-1500:]}")
    score = json.loads(report.read_text())
    final = score["final"] or {}
    return {
        "nodes": nodes, "tag": tag, "killed": kill_after_s is not None, "srun_exit": proc.returncode,
        "wall_s": round(wall, 1), "architectures": score["architectures"], "trainings": score["trainings"],
        "epochs": score["epochs"], "best_accuracy": score["best_accuracy"], "valid": score["valid"],
        "ops_per_s": final.get("ops_per_second", 0.0), "ops_per_s_per_node": final.get("ops_per_second", 0.0) / nodes,
        "regulated": final.get("score", 0.0),
    }


def _table(rows: list[dict]) -> str:
    lines = ["| nodes | run | trainings | epochs | best top-1 | valid | OPS | OPS per node | regulated score |",
             "|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['nodes']} | {r['tag']} | {r['trainings']} | {r['epochs']} | {r['best_accuracy']:.3f} | "
            f"{'yes' if r['valid'] else 'no'} | {r['ops_per_s']:.4g} | {r['ops_per_s_per_node']:.4g} | "
            f"{r['regulated']:.4g} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,4")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--name", default="aiperf")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "aiperf-scaling")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    if shutil.disk_usage("/var/tmp").free < 2 * 2**30:
        raise StudyError("less than 2 GiB free in /var/tmp; free some space first")
    shared = _up(args.name, max(counts))
    work = shared / f"aiperf-scaling-{int(time.time())}"
    rows: list[dict] = []
    try:
        data = work / "data"
        subprocess.run([str(MLHPC), "generate", "aiperf", "--config", "mini", "--out", str(data), "--seed",
                        str(seed)], check=True, timeout=600)
        for n in counts:
            rows.append(_run(args.name, work, data, n, args.minutes, seed, f"n{n}"))
            print(_table(rows[-1:]), end="", flush=True)
        if args.kill:
            n = max(counts)
            rows.append(_run(args.name, work, data, n, args.minutes, seed, f"n{n}-kill",
                             kill_after_s=args.minutes * 60 * 0.4))
            print(_table(rows[-1:]), end="", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            _vcluster(args.name, "down", check=False, timeout=120)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()
    record = {"rows": rows, "seed": seed, "minutes": args.minutes, "command": shlex.join(sys.argv),
              "machine": platform.node(), "cpus": len(__import__("os").sched_getaffinity(0)), "revision": revision}
    (args.out / f"aiperf_scaling_{stamp}.json").write_text(json.dumps(record, indent=1))
    (args.out / f"aiperf_scaling_{stamp}.md").write_text(_table(rows))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
