"""`mlhpc stage-bench`: the staging throughput study a site runs to learn its staging speed.

Sweeps file size x mode x ranks x workers (ranks are local processes, each with its own
directory standing in for a node) and measures, in the same run, `cp -r`, `tar | tar` and the
disk's raw sequential read and write. Copies are timed on the user's clock: the wall time without
`sync`, and until every staged file has been read once; the time with `sync` is only an extra
(`extra_with_sync_s`). Writes stage_bench.csv, stage_bench.png, stage_bench.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import time
from pathlib import Path
from typing import Any

from mlhpc.common.errors import ConfigError
from mlhpc.common.fileio import atomic_write_text
from mlhpc.common.plots import pyplot, write_png
from mlhpc.common.writable import (
    check_writable_dir,
    make_marked_dir,
    refuse_output_over_inputs,
    remove_marked_dir,
)
from mlhpc.staging.manifest import MANIFEST_NAME
from mlhpc.staging.plan import MODES
from mlhpc.staging.study import tools

CSV_FIELDS = (
    "file_kib",
    "files",
    "dataset_bytes",
    "method",
    "mode",
    "ranks",
    "workers",
    "wall_s",
    "read_once_s",
    "dataset_mb_s",
    "written_mb_s",
    "ratio_cp",
    "ratio_tar",
    "ratio_raw_read",
    "ratio_raw_write",
    "ratio_copy_limit",
    "ratio_cp_read_once",
    "ratio_tar_read_once",
    "source_reads",
    "extra_with_sync_s",
)
"""`wall_s` is the user's clock (no sync) and MB/s and the ratios are taken on it, `_read_once`
ratios on `read_once_s` (until every staged file has been read once); `extra_with_sync_s` (the
copy, then `sync`) is an extra. The raw disk rows have no read or sync figures (empty)."""


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
        from mlhpc.staging.study.model import GB, TB, Cluster, model_table

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
    outputs = _check_outputs(args)  # before minutes of measuring, not after
    datasets = _plan_datasets(args)
    cold = not args.warm
    print(
        f"{_estimate_line(datasets, args, modes)}; source: {args.scratch or args.data or 'a new folder in --out'}; "
        f"node-local: {args.local_dir or 'beside the source'}"
    )
    # Every folder written in is made here under a fresh name and marked; only those are removed.
    scratch_made = None if args.scratch else make_marked_dir(args.out, "stage-bench-scratch-")
    scratch = args.scratch or scratch_made.path  # type: ignore[union-attr]
    local_made = make_marked_dir(args.local_dir or scratch, "stage-bench-local-")
    rows: list[dict[str, Any]] = []
    try:
        for number, (file_kib, files, size) in enumerate(datasets, 1):
            src = _dataset(args, scratch, file_kib, files, size)
            dropped = cold and _drop_whole_cache_once()
            print(
                f"dataset {number} of {len(datasets)}: {files} files of {_size_label(file_kib)}; "
                f"source {'cold' if cold else 'warm'}{' (page cache dropped)' if dropped else ''}"
            )
            rows += _measure(args, modes, src, file_kib, files, size, local_made.path, cold)
    finally:
        remove_marked_dir(local_made)
        if scratch_made is not None:
            remove_marked_dir(scratch_made)
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
    own pages instead (`tools.evict`): dropping the whole cache per step cost minutes."""
    if not tools.drop_caches():
        return False
    time.sleep(tools.SETTLE_S)
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
    base = tools.medians(tools.timings_by_round(src, size, local, args.repeats, cold))
    for name, timing in base.items():
        rows.append(_row(file_kib, files, size, name, "", 1, 0, timing, size, base, 1.0))
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
            results = tools.run_plan_in_ranks(plan, ranks, local, args.comm)
            for w in args.workers:
                mine = [r for r in results if r["workers"] == w]
                timing = tools.median_timing([tools.Timing.from_row(r) for r in mine])
                written = size * (1 if mode == "shard" else ranks)
                reads = statistics.median(r["job_read_bytes"] for r in mine) / size
                rows.append(
                    _row(file_kib, files, size, "mlhpc", mode, ranks, w, timing, written, base, reads)
                )
                print(
                    f"{file_kib:>8} KiB  mlhpc {mode:<9} ranks={ranks} workers={w:<3} "
                    f"{written / timing.wall_s / 1e6:8.0f} MB/s written{_extra(timing)}  "
                    f"(source read {reads:.2f}x)"
                )
    return rows


def _plan_datasets(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(file KiB, files, bytes) of each dataset of the study, before any is made."""
    if args.data is not None:
        from mlhpc.staging.source import read_source

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
        print(f"generating {files} files of {_size_label(kib)} ({size / 2**20:.0f} MiB) in {root}")
    tools.make_dataset(root, args.total_mib << 20, kib << 10)
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
        depths = len(tools.RAW_DEPTHS)
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
        seconds += 0 if args.warm else tools.SETTLE_S + 1
    return seconds


def _estimate_line(datasets: list[tuple[int, int, int]], args: argparse.Namespace, modes: list[str]) -> str:
    seconds = estimate_seconds(datasets, args, modes)
    total = sum(size for _, _, size in datasets)
    when = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(1, round(seconds))} s"
    return (
        f"stage-bench: {len(datasets)} dataset(s), {total / 2**20:.0f} MiB in all; about {when} "
        f"if the disks give {ASSUMED_BYTES_S / 1e6:.0f} MB/s"
    )


def _extra(timing: tools.Timing) -> str:
    """The console's read-once and sync figures, where the method has them."""
    if timing.read_once_s is None or timing.extra_with_sync_s is None:
        return ""
    return (
        f" in {timing.wall_s:.3f} s, read once by {timing.read_once_s:.3f} s"
        f" (extra, with sync: {timing.extra_with_sync_s:.3f} s)"
    )


def _row(
    file_kib: int,
    files: int,
    size: int,
    method: str,
    mode: str,
    ranks: int,
    workers: int,
    timing: tools.Timing,
    written: int,
    base: dict[str, tools.Timing],
    reads: float,
) -> dict[str, Any]:
    """One CSV row: rates and ratios on the user's clock (`wall_s`), the read-once ratios on
    `read_once_s`; the sync-inclusive seconds only as the extra `extra_with_sync_s`."""
    seconds = timing.wall_s
    rate = written / seconds / 1e6

    def ratio(name: str) -> float:
        return round(rate / (size / base[name].wall_s / 1e6), 3)

    def read_once_ratio(name: str) -> float | None:
        theirs = base[name].read_once_s
        if timing.read_once_s is None or theirs is None:
            return None
        return round(written / timing.read_once_s / (size / theirs), 3)

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return {
        "file_kib": file_kib,
        "files": files,
        "dataset_bytes": size,
        "method": method,
        "mode": mode,
        "ranks": ranks,
        "workers": workers,
        "wall_s": round(seconds, 4),
        "read_once_s": rounded(timing.read_once_s),
        "dataset_mb_s": round(size / seconds / 1e6, 1),
        "written_mb_s": round(rate, 1),
        "ratio_cp": ratio("cp"),
        "ratio_tar": ratio("tar"),
        "ratio_raw_read": ratio("raw-read"),
        "ratio_raw_write": ratio("raw-write"),
        "ratio_copy_limit": ratio("copy-limit"),
        "ratio_cp_read_once": read_once_ratio("cp"),
        "ratio_tar_read_once": read_once_ratio("tar"),
        "source_reads": round(reads, 3),
        "extra_with_sync_s": rounded(timing.extra_with_sync_s),
    }


def write_outputs(paths: dict[str, Path], rows: list[dict[str, Any]], cold: bool) -> None:
    """The CSV, PNG and summary, each written whole under a temporary name, then renamed."""
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=CSV_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(paths["csv"], table.getvalue())
    plot(rows, paths["png"])
    atomic_write_text(paths["md"], summary(rows, cold))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()

    sizes = sorted({r["file_kib"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, kib in zip(axes[0], sizes, strict=True):
        here = [r for r in rows if r["file_kib"] == kib]
        for r in here:
            if r["method"] != "mlhpc":
                ax.axhline(
                    r["written_mb_s"], linestyle="--", linewidth=1, color=_COLORS.get(r["method"], "grey")
                )
                ax.annotate(
                    r["method"], (0, r["written_mb_s"]), xycoords=("axes fraction", "data"), fontsize=7
                )
        for mode, ranks in sorted({(r["mode"], r["ranks"]) for r in here if r["method"] == "mlhpc"}):
            line = sorted(
                (r["workers"], r["written_mb_s"], _read_once_mb_s(r))
                for r in here
                if (r["mode"], r["ranks"]) == (mode, ranks)
            )
            label = "1 rank" if ranks == 1 else f"{mode}, {ranks} ranks"
            (drawn,) = ax.plot([x for x, _, _ in line], [y for _, y, _ in line], marker="o", label=label)
            ax.plot(
                [x for x, _, _ in line],
                [y for _, _, y in line],
                marker=".",
                linestyle=":",
                color=drawn.get_color(),
                label=f"{label}, until read once",
            )
        ax.set_xscale("log", base=2)
        workers = sorted({r["workers"] for r in here if r["method"] == "mlhpc"})
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_title(f"{here[0]['files']} files of {_size_label(kib)}")
        ax.set_xlabel("workers per rank")
        ax.set_ylabel("MB/s written to node-local disk, user's clock (no sync)")
        ax.legend(fontsize=7)
    write_png(fig, path)


def _read_once_mb_s(row: dict[str, Any]) -> float:
    """Bytes written over the time until they have been read once."""
    return row["written_mb_s"] * row["wall_s"] / row["read_once_s"]


_COLORS = {"cp": "black", "tar": "brown", "raw-read": "green", "raw-write": "red", "copy-limit": "purple"}


def _size_label(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary(rows: list[dict[str, Any]], cold: bool) -> str:
    """The markdown summary: baselines, then the best worker count of each mode and rank count."""
    lines = [
        "# Staging throughput study",
        "",
        f"Cold source before every run: {'yes' if cold else 'no'} (its own pages evicted before each step; the",
        "whole page cache dropped once per dataset when run as root); medians of the repeats. Times are",
        "the user's clock: `s` is the copy's wall time as the user waits for it (no sync), `s read once`",
        "until every staged file has also been read once (a first epoch); `extra: s with sync` (the",
        "copy, then `sync` until it is on disk) is an extra, not what the user waits for. MB/s counts",
        "bytes written to node-local disk in `s` (replicate on k ranks writes k copies); ratios compare",
        "that with the baselines measured in the same run (`x cp read once` on `s read once`): raw read",
        "of the source disk, raw write of the node-local one, and `copy limit`, both at once with no",
        "software between them (a copy reads and writes every byte; on one shared disk the limit is",
        "below both). The raw measures write with O_DIRECT to disk, so above 1 x copy limit the page",
        "cache still holds writes the disk has not taken; near 1, the disks set the pace. `source",
        "reads` is the bytes read from the source over the dataset size (1.00: read once in total).",
        "Best worker count (by MB/s) shown.",
        "",
        "| files | method | mode | ranks | workers | s | s read once | MB/s | x cp | x cp read once | x tar "
        "| x raw read | x raw write | x copy limit | source reads | extra: s with sync |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kib in sorted({r["file_kib"] for r in rows}):
        here = [r for r in rows if r["file_kib"] == kib]
        best: dict[tuple[str, int], dict[str, Any]] = {}
        for r in here:
            key = (r["method"] + r["mode"], r["ranks"])
            if key not in best or r["written_mb_s"] > best[key]["written_mb_s"]:
                best[key] = r
        for r in best.values():
            lines.append(
                f"| {r['files']} x {_size_label(kib)} | {r['method']} | {r['mode'] or '-'} | {r['ranks']} | "
                f"{r['workers'] or '-'} | {r['wall_s']:.3f} | {_cell(r['read_once_s'], 3)} | "
                f"{r['written_mb_s']:.0f} | {r['ratio_cp']:.2f} | {_cell(r['ratio_cp_read_once'], 2)} | "
                f"{r['ratio_tar']:.2f} | {r['ratio_raw_read']:.2f} | {r['ratio_raw_write']:.2f} | "
                f"{r['ratio_copy_limit']:.2f} | {r['source_reads']:.2f} | {_cell(r['extra_with_sync_s'], 3)} |"
            )
    return "\n".join(lines) + "\n"
