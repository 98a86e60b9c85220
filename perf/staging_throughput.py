"""Staging on the user's clock: `mlhpc stage` against `cp -r`, `tar | tar` and parallel `cp`.

For each case (small or large files, source warm in the page cache or cold, one rank or
replicate/shard on 2 ranks) the methods take turns within each round and every figure is the
median of the rounds' own ratios, printed with the lowest and highest round:

- `copy`: the command's wall time, as a user waits for it (no sync). `mlhpc stage` is the
  real command in a new process; `in run` is `stage_dataset` in a process that has mlhpc
  imported already, as `mlhpc run` stages.
- `+read`: that, plus the time until every staged file has been read once (the first epoch).
- `+sync` (an extra, labelled): the copy, then `sync` until it is on disk.

Before each copy: `sync`, then for a cold case the page cache is dropped (root), for a warm
one the source is read once; then a pause of `dataset.SETTLE_S`. Copies of many small files go to
new folders that are removed only at the end: removing thousands of files makes ext4 skip the
freed inodes for a minute or more (`recently_deleted`), which would slow whichever copy runs
next. `--cgroup-mib N` runs the large cold case once more with `mlhpc stage` in a memory cgroup
of N MiB (v1 or v2, root): a dataset larger than the memory it may use, against `cp -r` there.

    python perf/staging_throughput.py [--rounds 3] [--cases small-warm,small-cold,large-warm,large-cold]
        [--small-files 4000] [--small-kib 64] [--large-files 4] [--large-mib 128] [--ranks 2]
        [--dir SCRATCH] [--cgroup-mib 256]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mlhpc.staging.request import StageRequest
from mlhpc.staging.stage import stage_dataset
from mlhpc.study import cgroup, clock, dataset, rank_groups

CASES = ("small-warm", "small-cold", "large-warm", "large-cold", "small-ranks", "large-ranks")


def prepare(src: Path, cold: bool) -> None:
    os.sync()
    if cold:
        dataset.drop_caches()
    else:
        dataset.read_all(src)
    time.sleep(dataset.SETTLE_S)


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Case:
    """One case's rounds: seconds of each method's copy, read and sync, and CPU seconds."""

    def __init__(self) -> None:
        self.copy: dict[str, list[float]] = {}
        self.read: dict[str, list[float]] = {}
        self.sync: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def measure(self, name: str, src: Path, dest: Path, cold: bool, copy: Callable[[], object]) -> None:
        """`copy` may return its own seconds (ranks timed inside their launch), else it is timed
        (`clock.user_clock`, as `mlhpc stage-bench` times)."""
        prepare(src, cold)
        cpu = 0.0

        def counted() -> object:
            nonlocal cpu
            before = cpu_seconds()
            own = copy()
            cpu = cpu_seconds() - before
            return own

        timing = clock.user_clock(counted, dest)
        assert timing.read_once_s is not None and timing.extra_with_sync_s is not None  # user_clock times all
        self.cpu.setdefault(name, []).append(cpu)
        self.copy.setdefault(name, []).append(timing.wall_s)
        self.read.setdefault(name, []).append(timing.read_once_s)
        self.sync.setdefault(name, []).append(timing.extra_with_sync_s)

    def ratio(self, table: dict[str, list[float]], base: str, mine: str) -> str:
        ratios = [b / m for b, m in zip(table[base], table[mine], strict=True)]
        return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"

    def report(self, title: str, files: int, baselines: list[str], mine: list[str]) -> None:
        print(f"{title}: seconds (median of {len(next(iter(self.copy.values())))} rounds)")
        for name in self.copy:
            med = {k: statistics.median(v[name]) for k, v in (("copy", self.copy), ("read", self.read))}
            cpu = statistics.median(self.cpu[name])
            print(
                f"   {name:<14} copy {med['copy']:.3f}  +read {med['read']:.3f}  "
                f"+sync {statistics.median(self.sync[name]):.3f}  cpu {cpu:.3f} s ({cpu / files * 1e6:.0f} us a file)"
            )
        for base in baselines:
            for name in mine:
                print(
                    f"   {base} / {name}: copy {self.ratio(self.copy, base, name)}, +read "
                    f"{self.ratio(self.read, base, name)}, +sync (extra) {self.ratio(self.sync, base, name)}"
                )


def cp_r(src: Path, dest: Path) -> None:
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)


def tar_tar(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    writer = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=writer.stdout, check=True)
    writer.wait()


def parallel_cp(src: Path, dest: Path) -> None:
    """One `cp` per file, all at once (the folders made first)."""
    files = dataset.source_files(src)
    for path in files:
        (dest / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen(["cp", str(p), str(dest / p.relative_to(src))]) for p in files]
    if any(p.wait() for p in procs):
        raise RuntimeError("parallel cp failed")


def mlhpc_command(src: Path, dest: Path, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "stage", str(src), str(dest), *extra], capture_output=True, text=True
    )
    if proc.returncode:
        sys.exit(f"mlhpc stage failed: {proc.stderr.strip()}")


def one_rank(case: str, src: Path, work: Path, rounds: int, files: int) -> None:
    cold = case.endswith("cold")
    large = case.startswith("large")
    methods: dict[str, Callable[[Path], object]] = {
        "cp -r": lambda d: cp_r(src, d),
        "tar | tar": lambda d: tar_tar(src, d),
        "mlhpc stage": lambda d: mlhpc_command(src, d),
        "in run": lambda d: stage_dataset(StageRequest(src, d)),
    }
    if large:
        methods["parallel cp"] = lambda d: parallel_cp(src, d)
    result = Case()
    for r in range(rounds):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for name in order:
            dest = work / f"{case}-{name.replace(' ', '').replace('|', '')}-{r}"
            result.measure(name, src, dest, cold, functools.partial(methods[name], dest))
            if large:
                shutil.rmtree(dest)  # four files: no inode effect worth the disk space
    baselines = ["cp -r", "tar | tar"] + (["parallel cp"] if large else [])
    mine = ["mlhpc stage", "in run"]
    result.report(f"{case} ({files} files)", files, baselines, mine)


def two_ranks(case: str, src: Path, work: Path, rounds: int, files: int, ranks: int) -> None:
    """replicate and shard on `ranks` local ranks (each its own node folder), against `ranks`
    concurrent `cp -r` (each node copying the whole set, as without mlhpc); warm source."""
    result = Case()
    for r in range(rounds):
        for name in ("cp -r x2", "replicate", "shard") if r % 2 == 0 else ("shard", "replicate", "cp -r x2"):
            dest = work / f"{case}-{name.replace(' ', '')}-{r}"

            def copy(dest: Path = dest, name: str = name) -> float | None:
                if name == "cp -r x2":
                    dest.mkdir()
                    procs = [
                        subprocess.Popen(["cp", "-r", str(src), str(dest / f"node{n}")]) for n in range(ranks)
                    ]
                    if any(p.wait() for p in procs):
                        raise RuntimeError("cp -r failed")
                    return None
                row = {"src": str(src), "dest": str(dest), "mode": name, "workers": 32}
                row |= {"cold": False, "read": False, "sync": False, "keep": True}  # read and synced here
                return float(rank_groups.run_plan_in_ranks([row], ranks, work)[0]["wall_s"])

            result.measure(name, src, dest, False, copy)
    result.report(f"{case}, {ranks} ranks, warm ({files} files)", files, ["cp -r x2"], ["replicate", "shard"])


def cgroup_case(src: Path, work: Path, mib: int, rounds: int) -> None:
    """`mlhpc stage` against `cp -r`, both inside a memory cgroup of `mib` MiB (a dataset
    larger than the memory it may use), cold."""
    group = cgroup.memory_cgroup(f"mlhpc-perf-{os.getpid()}", mib << 20)
    if group is None:
        print("cgroup case skipped: no writable memory cgroup (needs root)")
        return
    commands = {
        "cp -r": lambda dest: ["cp", "-r", str(src), str(dest)],
        "mlhpc stage": lambda dest: [sys.executable, "-m", "mlhpc", "stage", str(src), str(dest)],
    }
    try:
        result = Case()
        for r in range(rounds):
            for name in commands if r % 2 == 0 else reversed(commands):
                dest = work / f"cgroup-{name.replace(' ', '')}-{r}"

                def copy(dest: Path = dest, name: str = name) -> None:
                    cgroup.run_in_cgroup(group, commands[name](dest))

                result.measure(name, src, dest, True, copy)
                shutil.rmtree(dest)
        result.report(f"large cold in a {mib} MiB memory cgroup", 1, ["cp -r"], ["mlhpc stage"])
    finally:
        cgroup.remove_cgroup(group)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES[:4]), help=f"some of {','.join(CASES)}")
    parser.add_argument("--small-files", type=int, default=4000)
    parser.add_argument("--small-kib", type=int, default=64)
    parser.add_argument("--large-files", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (source and copies)")
    parser.add_argument(
        "--cgroup-mib", type=int, default=0, help="also the large cold case in a memory cgroup"
    )
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        sys.exit(f"unknown cases {sorted(unknown)}; use {','.join(CASES)}")
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        work = Path(scratch)
        print(f"cold page cache possible: {dataset.drop_caches()}; scratch {work}; {os.cpu_count()} CPUs")
        small, large = work / "src-small", work / "src-large"
        sizes = {
            "small": (args.small_files, args.small_kib << 10),
            "large": (args.large_files, args.large_mib << 20),
        }
        for case in cases:
            kind = case.split("-")[0]
            files, size = sizes[kind]
            src = small if kind == "small" else large
            dataset.make_dataset(src, files * size, size)
            if case.endswith("ranks"):
                two_ranks(case, src, work, args.rounds, files, args.ranks)
            else:
                one_rank(case, src, work, args.rounds, files)
        if args.cgroup_mib:
            dataset.make_dataset(large, args.large_files * (args.large_mib << 20), args.large_mib << 20)
            cgroup_case(large, work, args.cgroup_mib, args.rounds)


if __name__ == "__main__":
    main()
