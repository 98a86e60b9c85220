"""The staging study's outputs: one CSV row per measured point (rates and ratios on the user's
clock), the plot of MB/s against workers, and the markdown summary of the best worker counts."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from mlhpc.common.display.plots import pyplot, write_png
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.study.clock import Timing

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


def csv_row(
    point: dict[str, Any], timing: Timing, written: int, base: dict[str, Timing], reads: float
) -> dict[str, Any]:
    """One CSV row: the measured `point` (its dataset, method, mode, ranks and workers), then rates
    and ratios on the user's clock (`wall_s`), the read-once ratios on `read_once_s`; the
    sync-inclusive seconds only as the extra `extra_with_sync_s`."""
    size, seconds = point["dataset_bytes"], timing.wall_s
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
        **point,
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
        ax.set_title(f"{here[0]['files']} files of {size_label(kib)}")
        ax.set_xlabel("workers per rank")
        ax.set_ylabel("MB/s written to node-local disk, user's clock (no sync)")
        ax.legend(fontsize=7)
    write_png(fig, path)


def _read_once_mb_s(row: dict[str, Any]) -> float:
    """Bytes written over the time until they have been read once."""
    return row["written_mb_s"] * row["wall_s"] / row["read_once_s"]


_COLORS = {"cp": "black", "tar": "brown", "raw-read": "green", "raw-write": "red", "copy-limit": "purple"}


def size_label(kib: int) -> str:
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
                f"| {r['files']} x {size_label(kib)} | {r['method']} | {r['mode'] or '-'} | {r['ranks']} | "
                f"{r['workers'] or '-'} | {r['wall_s']:.3f} | {_cell(r['read_once_s'], 3)} | "
                f"{r['written_mb_s']:.0f} | {r['ratio_cp']:.2f} | {_cell(r['ratio_cp_read_once'], 2)} | "
                f"{r['ratio_tar']:.2f} | {r['ratio_raw_read']:.2f} | {r['ratio_raw_write']:.2f} | "
                f"{r['ratio_copy_limit']:.2f} | {r['source_reads']:.2f} | {_cell(r['extra_with_sync_s'], 3)} |"
            )
    return "\n".join(lines) + "\n"
