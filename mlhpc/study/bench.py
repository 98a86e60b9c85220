"""`mlhpc stage-bench`: the staging throughput study a site runs to learn its staging speed.

Sweeps file size x mode x ranks x workers (ranks are local processes, each with its own
directory standing in for a node) and measures, in the same run, `cp -r`, `tar | tar` and the
disk's raw sequential read and write. Copies are timed on the user's clock: the wall time without
`sync`, and until every staged file has been read once; the time with `sync` is only an extra
(`extra_with_sync_s`). Writes stage_bench.csv, stage_bench.png, stage_bench.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio.writable import check_writable_dir, refuse_output_over_inputs
from mlhpc.staging.manifest import MANIFEST_NAME
from mlhpc.staging.plan import MODES
from mlhpc.study import baselines, dataset, rank_groups, space
from mlhpc.study.clock import Timing, median_timing, medians
from mlhpc.study.raw import RAW_DEPTHS
from mlhpc.study.report import csv_row, size_label, write_outputs


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from e


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="where the CSV, PNG and summary go")
    parser.add_argument("--data", type=Path, default=None, help="a real dataset instead of generated ones")
    parser.add_argument("--total-mib", type=int, default=256, help="size of each generated dataset")
    parser.add_argument("--file-kib", type=_ints, default=[64, 1024, 65536], help="file sizes (KiB)")
    parser.add_argument("--workers", type=_ints, default=[1, 8, 32], help="parallel copies per rank")
    parser.add_argument(
        "--modes", default="replicate,shard", help=f"modes for ranks > 1 ({', '.join(MODES)})"
    )
    parser.add_argument("--ranks", type=_ints, default=[1, 2], help="local rank processes (each a node)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point; the median is reported")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="where generated datasets go: the source disk (default OUT/scratch)",
    )
    parser.add_argument(
        "--local-dir",
        type=Path,
        default=None,
        help="where each rank's copy goes: the node-local disk (default: the scratch directory)",
    )
    parser.add_argument("--comm", choices=("torch", "mpi"), default="torch", help="backend for ranks > 1")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="keep the source in the page cache (default: evict it before each step; as root, also "
        "drop the whole cache once per dataset)",
    )
    model = parser.add_argument_group("the paper model (--model prints it and exits)")
    model.add_argument("--model", action="store_true", help="print staging time vs node count and exit")
    model.add_argument("--fs-gbs", type=float, default=100.0, help="shared FS aggregate read GB/s")
    model.add_argument("--client-gbs", type=float, default=10.0, help="shared FS read GB/s per node")
    model.add_argument("--network-gbs", type=float, default=25.0, help="network GB/s per node")
    model.add_argument("--local-gbs", type=float, default=6.0, help="node-local disk write GB/s")
    model.add_argument("--local-tb", type=float, default=7.68, help="node-local disk capacity TB")


def run_bench(args: argparse.Namespace) -> int:
    if args.model:
        from mlhpc.study.model import GB, TB, Cluster, model_table

        cluster = Cluster(
            shared_fs_bytes_s=args.fs_gbs * GB,
            client_bytes_s=args.client_gbs * GB,
            network_bytes_s=args.network_gbs * GB,
            local_write_bytes_s=args.local_gbs * GB,
            local_capacity_bytes=args.local_tb * TB,
        )
        print(model_table(cluster))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        raise ConfigError(f"--modes {','.join(unknown)} unknown; use {', '.join(MODES)}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats} must be at least 1")
    space.check_counts(args)
    outputs = _check_outputs(args)  # before minutes of measuring, not after
    datasets = _plan_datasets(args)
    space.sweep_leftovers(args)  # what killed studies left, before the free space is looked at
    space.check_free_space(args, datasets, args.scratch or args.out)
    cold = not args.warm
    print(
        f"{_estimate_line(datasets, args, modes)}; source: {args.scratch or args.data or 'a new folder in --out'}; "
        f"node-local: {args.local_dir or 'beside the source'}"
    )
    # Every folder written in is made here under a fresh name and marked; only those are removed.
    scratch_made = None if args.scratch else space.claimed_dir(args.out, space.SCRATCH_PREFIX, args.out)
    scratch = args.scratch or scratch_made.path  # type: ignore[union-attr]
    local_made = space.claimed_dir(args.local_dir or scratch, space.LOCAL_PREFIX, args.out)
    rows: list[dict[str, Any]] = []
    try:
        for number, (file_kib, files, size) in enumerate(datasets, 1):
            src = _dataset(args, scratch, file_kib, files, size)
            dropped = cold and _drop_whole_cache_once()
            print(
                f"dataset {number} of {len(datasets)}: {files} files of {size_label(file_kib)}; "
                f"source {'cold' if cold else 'warm'}{' (page cache dropped)' if dropped else ''}"
            )
            rows += _measure(args, modes, src, file_kib, files, size, local_made.path, cold)
    finally:  # renamed to trash first, the owner marker last: a kill leaves what the next study removes
        space.remove_claimed(local_made)
        if scratch_made is not None:
            space.remove_claimed(scratch_made)
    write_outputs(outputs, rows, cold)
    print(f"wrote {outputs['csv']}, {outputs['png']}, {outputs['md']}")
    return 0


def _check_outputs(args: argparse.Namespace) -> dict[str, Path]:
    """Refuse, in one line, any output that is or lies in `--data`, or a folder that cannot be
    written; the three result files' real paths."""
    inputs = [args.data]
    for option, folder in (("--out", args.out), ("--scratch", args.scratch), ("--local-dir", args.local_dir)):
        if folder is not None:
            refuse_output_over_inputs(folder, inputs, option, folder=True)
            check_writable_dir(folder, option)
    return {
        kind: refuse_output_over_inputs(
            args.out / f"stage_bench.{kind}", inputs, "--out", suffixes=(f".{kind}",)
        )
        for kind in ("csv", "png", "md")
    }


def _drop_whole_cache_once() -> bool:
    """Drop the machine's page cache (root only) and let the freed pages settle: once per dataset,
    so that its first copy also finds directories and inodes cold. Each step evicts the source's
    own pages instead (`dataset.evict`): dropping the whole cache per step cost minutes."""
    if not dataset.drop_caches():
        return False
    time.sleep(dataset.SETTLE_S)
    return True


def _measure(
    args: argparse.Namespace,
    modes: list[str],
    src: Path,
    file_kib: int,
    files: int,
    size: int,
    local: Path,
    cold: bool,
) -> list[dict[str, Any]]:
    """The baselines, then `mlhpc stage` per rank count, mode and worker count, on one dataset."""
    rows = []
    measured = {"file_kib": file_kib, "files": files, "dataset_bytes": size}
    base = medians(baselines.timings_by_round(src, size, local, args.repeats, cold))
    for name, timing in base.items():
        point = {**measured, "method": name, "mode": "", "ranks": 1, "workers": 0}
        rows.append(csv_row(point, timing, size, base, 1.0))
        print(f"{file_kib:>8} KiB  {name:<10} {size / timing.wall_s / 1e6:8.0f} MB/s{_extra(timing)}")
    for ranks in args.ranks:
        for mode in ["replicate"] if ranks == 1 else modes:
            plan = [
                {
                    "src": str(src),
                    "dest": str(local / f"stage-{file_kib}k-{mode}-{ranks}"),
                    "mode": mode,
                    "workers": w,
                    "cold": cold,
                }
                for w in args.workers
                for _ in range(args.repeats)
            ]
            results = rank_groups.run_plan_in_ranks(plan, ranks, local, args.comm)
            for w in args.workers:
                mine = [r for r in results if r["workers"] == w]
                timing = median_timing([Timing.from_row(r) for r in mine])
                written = size * (1 if mode == "shard" else ranks)
                reads = statistics.median(r["job_read_bytes"] for r in mine) / size
                point = {**measured, "method": "mlhpc", "mode": mode, "ranks": ranks, "workers": w}
                rows.append(csv_row(point, timing, written, base, reads))
                print(
                    f"{file_kib:>8} KiB  mlhpc {mode:<9} ranks={ranks} workers={w:<3} "
                    f"{written / timing.wall_s / 1e6:8.0f} MB/s written{_extra(timing)}  "
                    f"(source read {reads:.2f}x)"
                )
    return rows


def _plan_datasets(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(file KiB, files, bytes) of each dataset of the study, before any is made."""
    if args.data is not None:
        from mlhpc.staging.stage import read_source

        manifest, _ = read_source(args.data)
        files, size = len(manifest.files), manifest.total_bytes
        return [(size // max(1, files) >> 10, files, size)]
    plans = []
    for kib in args.file_kib:
        if kib < 1:
            raise ConfigError(f"--file-kib {kib} must be at least 1")
        files = max(1, (args.total_mib << 20) // (kib << 10))
        plans.append((kib, files, files * (kib << 10)))
    return plans


def _dataset(args: argparse.Namespace, scratch: Path, kib: int, files: int, size: int) -> Path:
    """The source of one dataset: `--data`, or one generated under the scratch folder (reused
    there when a study made it before)."""
    if args.data is not None:
        return args.data
    root = scratch / f"data-{kib}k"
    if not (root / MANIFEST_NAME).is_file():
        print(f"generating {files} files of {size_label(kib)} ({size / 2**20:.0f} MiB) in {root}")
    dataset.make_dataset(root, args.total_mib << 20, kib << 10)
    os.sync()  # written back, so that evicting its pages later leaves it cold
    return root


ASSUMED_BYTES_S = 300e6
"""The disk speed the up-front estimate assumes (a SATA SSD or a busy NVMe); its line says so."""
PER_FILE_S = 1e-4
"""What each file costs a copy beyond its bytes (open, create, close), for the estimate."""
GROUP_LAUNCH_S = 5.0
"""Starting a group of rank processes (torch's launcher and imports), for the estimate."""


def estimate_seconds(
    datasets: list[tuple[int, int, int]], args: argparse.Namespace, modes: list[str]
) -> float:
    """Roughly how long the study takes: bytes read and written by every step at
    `ASSUMED_BYTES_S`, a cost per file, a launch per rank group and the cache drops."""
    seconds = 0.0
    for _, files, size in datasets:
        generate = 2 * size if args.data is None else 0  # written, then read for the manifest
        # per round: cp and tar (read, write, read once), raw write, raw read, copy limit, per depth
        depths = len(RAW_DEPTHS)
        base = args.repeats * (2 * 3 * size + depths * 4 * size)
        runs = 0
        for ranks in args.ranks:
            for mode in ["replicate"] if ranks == 1 else modes:
                copies = 1 if mode == "shard" else ranks
                runs += len(args.workers) * args.repeats * (size + 2 * copies * size)
                seconds += GROUP_LAUNCH_S if ranks > 1 else 0
        steps = args.repeats * 2 + len(args.workers) * args.repeats * sum(
            len(["replicate"] if r == 1 else modes) for r in args.ranks
        )
        seconds += (generate + base + runs) / ASSUMED_BYTES_S + 3 * files * steps * PER_FILE_S
        seconds += 0 if args.warm else dataset.SETTLE_S + 1
    return seconds


def _estimate_line(datasets: list[tuple[int, int, int]], args: argparse.Namespace, modes: list[str]) -> str:
    seconds = estimate_seconds(datasets, args, modes)
    total = sum(size for _, _, size in datasets)
    when = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(1, round(seconds))} s"
    return (
        f"stage-bench: {len(datasets)} dataset(s), {total / 2**20:.0f} MiB in all; about {when} "
        f"if the disks give {ASSUMED_BYTES_S / 1e6:.0f} MB/s"
    )


def _extra(timing: Timing) -> str:
    """The console's read-once and sync figures, where the method has them."""
    if timing.read_once_s is None or timing.extra_with_sync_s is None:
        return ""
    return (
        f" in {timing.wall_s:.3f} s, read once by {timing.read_once_s:.3f} s"
        f" (extra, with sync: {timing.extra_with_sync_s:.3f} s)"
    )
