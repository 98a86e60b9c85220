"""What `mlhpc stage-bench` may ask of the machine before it writes a byte: its counts bounded by
the CPUs, the disk space its datasets and copies take checked against what is free, and the
folders killed studies left (marked, their owner gone) removed.

A `--total-mib 99999999999` once printed an estimate of a billion minutes and then filled the
disk (15-25 GB in two minutes); a SIGKILL during the removal left it all.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from mlhpc.common.cluster.threads import count_bound
from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio.writable import MadeDir, carries_marker, make_marked_dir
from mlhpc.staging.localdir import claim_stage_dir, remove_claimed_dir, remove_stale_stage_dirs

SCRATCH_PREFIX = "stage-bench-scratch-"
LOCAL_PREFIX = "stage-bench-local-"
MARGIN_BYTES = 64 << 20
"""Room kept free beyond what the study writes (manifests, the page cache's dirty pages, logs)."""
MAX_REPEATS = 1000


def check_counts(args: argparse.Namespace) -> None:
    """One line for a count no machine runs: ranks over this machine's CPUs (at least 4), workers
    or sizes below 1 or over their bound."""
    cpus = os.cpu_count() or 1
    bounds = {
        "--total-mib": ([args.total_mib], 1 << 40, "a mebibyte to an exbibyte"),
        "--file-kib": (args.file_kib, 1 << 40, "at least 1"),
        "--workers": (args.workers, count_bound(), "4 per CPU of this machine, at least 64"),
        "--ranks": (args.ranks, max(4, cpus), "one per CPU of this machine, at least 4"),
        "--repeats": ([args.repeats], MAX_REPEATS, f"at most {MAX_REPEATS}"),
    }
    for flag, (values, most, why) in bounds.items():
        for value in values:
            if not 1 <= value <= most:
                raise ConfigError(
                    f"mlhpc stage-bench {flag} {value}: it must be from 1 to {most} ({why}); pass a value in that range"
                )


def check_free_space(args: argparse.Namespace, datasets: list[tuple[int, int, int]], scratch: Path) -> None:
    """Refuse, in one line, a study whose generated datasets (all kept until the end, in the
    scratch folder) and largest copy per rank (in the node-local folder) do not fit the free
    space, with a margin; one disk holding both must hold their sum."""
    local = Path(args.local_dir or scratch)
    generated = 0 if args.data is not None else sum(size for _, _, size in datasets)
    copies = max((size for _, _, size in datasets), default=0) * max(args.ranks)
    needs: dict[int, tuple[int, Path]] = {}
    for folder, need in ((scratch, generated), (local, copies)):
        existing = _existing(folder)
        device = os.stat(existing).st_dev
        total, _ = needs.get(device, (0, existing))
        needs[device] = (total + need, existing)
    for need, folder in needs.values():
        free = shutil.disk_usage(folder).free
        if need + MARGIN_BYTES > free:
            raise ConfigError(
                f"mlhpc stage-bench needs about {_mib(need + MARGIN_BYTES)} on the disk of {folder}, which has "
                f"{_mib(free)} free; lower --total-mib or --ranks, or point --scratch/--local-dir at a larger disk"
            )


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest parent that exists (the study makes the rest)."""
    folder = Path(os.path.abspath(folder))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _mib(count: int) -> str:
    return f"{count / 2**20:,.0f} MiB"


def sweep_leftovers(args: argparse.Namespace) -> None:
    """Remove the folders earlier studies that were killed left in --out, --scratch and
    --local-dir: only those `claim` marked, whose owner has ended (staging/localdir's proof)."""
    for root, prefix in (
        (args.out, SCRATCH_PREFIX),
        (args.scratch, LOCAL_PREFIX),
        (args.local_dir, LOCAL_PREFIX),
    ):
        if root is not None and Path(root).is_dir():
            remove_stale_stage_dirs(Path(root), prefix)


def claimed_dir(parent: Path, prefix: str, out: Path) -> MadeDir:
    """A fresh marked folder (writable.make_marked_dir) that also carries an owner marker, so that
    a later study can prove it ours and its owner gone if this one is killed."""
    made = make_marked_dir(parent, prefix)
    claim_stage_dir(made.path, out)
    return made


def remove_claimed(made: MadeDir) -> bool:
    """Remove `made` if it still carries our token, in steps a kill cannot leave unprovable
    (renamed to trash, the owner marker last: staging/localdir.remove_claimed_dir)."""
    return carries_marker(made) and remove_claimed_dir(made.path)
