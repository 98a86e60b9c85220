"""A/B of `mlhpc stage` between two code versions on one machine, in one run.

    python perf/stage_ab.py --base 9d67b16 [--files 10000] [--kib 64] [--rounds 8] [--cold]

Builds an importable copy of `--base` (a git worktree under the work folder) beside this
checkout, writes a dataset of `--files` x `--kib` KiB files with its manifest, and stages it into
a new folder on the same disk with each version in turn (the order alternates by round), each
run a new process as a user's is. Every round starts with a throwaway run: on this VM the first
run after a large folder is removed costs up to 1.8x the CPU of the next. Prints each run's wall
and CPU time (the process and its worker processes) and the medians, with this checkout's ratio
to the base. `--cold` drops the page cache before every run (root), so each version reads the
source from the disk; without it the source is in the page cache (warm).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("common", "staging", "submission_checker", "benchmarks")


def importable(checkout: Path, where: Path) -> Path:
    """A folder to put on PYTHONPATH so that `mlhpc.*` imports from `checkout` (the repo maps
    its root folders into one namespace, as pyproject's package-dir does)."""
    package = where / "mlhpc"
    package.mkdir(parents=True)
    for item in (checkout / "mlhpc").iterdir():
        (package / item.name).symlink_to(item)
    for name in SUBPACKAGES:
        (package / name).symlink_to(checkout / name)
    return where


def stage_seconds(pythonpath: Path, src: Path, dest: Path, cold: bool = False) -> tuple[float, float]:
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["sync"], check=False)
    if cold:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "stage", str(src), str(dest)], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"stage_ab: mlhpc stage failed: {proc.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--kib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new temp folder)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each run (root)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="mlhpc-stage-ab-"))
    base = work / "base-checkout"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "-f", "--detach", str(base), args.base], check=True
    )
    try:
        paths = {"base": importable(base, work / "pkg-base"), "this": importable(REPO, work / "pkg-this")}
        src = work / "src"
        data = os.urandom(args.kib << 10)
        for i in range(args.files):
            folder = src / f"d{i // 1000}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{i}.bin").write_bytes(data)
        env = {**os.environ, "PYTHONPATH": str(paths["this"])}
        subprocess.run([sys.executable, "-m", "mlhpc", "manifest", str(src)], env=env, check=True)
        runs: dict[str, list[tuple[float, float]]] = {"base": [], "this": []}
        for r in range(args.rounds):
            stage_seconds(paths["this"], src, work / "dest-warm")
            for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                wall, cpu = stage_seconds(paths[name], src, work / f"dest-{name}", args.cold)
                runs[name].append((wall, cpu))
                print(f"round {r} {name:4}: wall {wall:.2f} s, cpu {cpu:.2f} s", flush=True)
        medians = {}
        for name, values in runs.items():
            walls, cpus = [w for w, _ in values], [c for _, c in values]
            medians[name] = (statistics.median(walls), statistics.median(cpus))
            print(
                f"{name:4}: wall median {medians[name][0]:.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
                f"cpu median {medians[name][1]:.2f} s ({min(cpus):.2f}-{max(cpus):.2f}), "
                f"{medians[name][1] / args.files * 1e6:.0f} us cpu a file"
            )
        slower = sum(t[1] > b[1] for t, b in zip(runs["this"], runs["base"], strict=True))
        print(
            f"this / base: wall {medians['this'][0] / medians['base'][0]:.2f}x, cpu "
            f"{medians['this'][1] / medians['base'][1]:.2f}x; more cpu in {slower} of {args.rounds} rounds"
        )
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
