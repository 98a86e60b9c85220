"""`mlhpc stage-bench` asks the machine only for what it has (issue 39): its counts bounded, the
free space checked before a byte is written, and its folders removed in steps a SIGKILL cannot
leave unprovable, which the next study then removes."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.cluster.threads import count_bound
from mlhpc.common.errors import ConfigError
from mlhpc.staging.localdir import STAGE_OWNER
from mlhpc.study import space
from tests.helpers.cli import cli_env

REPO = Path(__file__).resolve().parents[2]


def bench_args(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "total_mib": 1,
        "file_kib": [64],
        "workers": [1],
        "ranks": [1],
        "repeats": 1,
        "data": None,
        "scratch": None,
        "local_dir": None,
        "out": Path("out"),
    }
    return argparse.Namespace(**{**values, **given})


HUGE = st.one_of(st.integers(-(10**20), 10**20), st.integers(-2, 70))


@settings(max_examples=150, deadline=None)
@given(flag=st.sampled_from(["total_mib", "file_kib", "workers", "ranks", "repeats"]), value=HUGE)
def test_every_count_is_bounded_in_one_line(flag: str, value: int) -> None:
    args = bench_args(**{flag: [value] if flag in ("file_kib", "workers", "ranks") else value})
    most = {
        "total_mib": 1 << 40,
        "file_kib": 1 << 40,
        "workers": count_bound(),
        "ranks": max(4, os.cpu_count() or 1),
        "repeats": space.MAX_REPEATS,
    }[flag]
    if 1 <= value <= most:
        space.check_counts(args)
        return
    with pytest.raises(ConfigError) as refused:
        space.check_counts(args)
    assert f"--{flag.replace('_', '-')} {value}: it must be from 1 to {most}" in str(refused.value)


def test_a_study_larger_than_the_free_space_is_refused_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "stage-bench", "--out", str(out), "--total-mib", "99999999999"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "needs about" in proc.stderr and "MiB free; lower --total-mib" in proc.stderr
    assert not out.exists(), "nothing written"


def test_the_free_space_check_counts_copies_per_rank(tmp_path: Path) -> None:
    """The control: the same datasets pass with one rank and fail with more copies than fit."""
    free_mib = shutil.disk_usage(tmp_path).free >> 20
    size = (free_mib // 3) << 20
    datasets = [(1024, 1, size)]
    space.check_free_space(bench_args(ranks=[1], data=tmp_path), datasets, tmp_path)
    with pytest.raises(ConfigError, match="needs about"):
        space.check_free_space(bench_args(ranks=[4], data=tmp_path), datasets, tmp_path)


REMOVER = """
import sys, time
from pathlib import Path
from mlhpc.study import space

made = space.claimed_dir(Path(sys.argv[1]), space.SCRATCH_PREFIX, Path(sys.argv[1]))
for i in range(3000):
    folder = made.path / f"data-64k/d{i % 8}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"f{i}").write_bytes(b"x" * 64)
print("made", flush=True)
sys.stdin.readline()
space.remove_claimed(made)
"""

_RNG = random.Random(39)
KILL_DELAYS = [round(_RNG.uniform(0.0, 0.12), 3) for _ in range(4)]
"""Seeded points in the removal (about 0.1-0.3 s for 3,000 files): before, inside, near its end."""


@pytest.mark.parametrize("delay", KILL_DELAYS)
def test_a_sigkill_during_removal_leaves_what_the_next_study_removes(tmp_path: Path, delay: float) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", REMOVER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(PYTHONPATH=str(REPO)),
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "made"
    proc.stdin.write("\n")
    proc.stdin.flush()
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    for folder in out.iterdir():  # cut short: still provably ours (or an empty trash folder)
        assert (folder / STAGE_OWNER).is_file() or not any(folder.iterdir()), folder
    space.sweep_leftovers(bench_args(out=out))
    assert list(out.iterdir()) == []
