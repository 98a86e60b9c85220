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
import sys
from typing import Any

from cluster_staging_cluster import StudyError, cmd_down, cmd_shape, cmd_up
from cluster_staging_measure import cmd_allgather, cmd_gather_task, cmd_measure, cmd_task
from cluster_staging_report import cmd_model, cmd_report

from mlhpc.study.model import MODES


def _add_hidden(sub: Any) -> None:
    """The commands the study runs on the nodes itself (srun), not shown in --help."""
    gt = sub.add_parser("gather-task", help=argparse.SUPPRESS)
    gt.add_argument("--repeats", type=int, default=3)
    ta = sub.add_parser("task", help=argparse.SUPPRESS)
    ta.add_argument("--dest", required=True, help="the stage's DEST: its window opens when DEST appears")
    ta.add_argument("command", nargs=argparse.REMAINDER)


def _parser() -> argparse.ArgumentParser:
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
    args = _parser().parse_args(argv)
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
