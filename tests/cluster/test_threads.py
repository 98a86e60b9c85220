"""common/cluster/threads: a rank's torch threads come from the CPUs it may really use (affinity, cgroup
quota, ranks on the node), an explicit OMP_NUM_THREADS wins, and OpenMP threads spin briefly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.cluster.threads import (
    CpuBudget,
    _cpu_times,
    cgroup_cpu_quota,
    choose_threads,
    cpu_budget,
    idle_cpus,
    wait_briefly,
)
from mlhpc.common.errors import ConfigError

WHOLE_MACHINE = CpuBudget(cpus=64, bound=False, why="affinity 64 of 64 CPUs")


def test_the_node_s_cpus_are_shared_by_its_ranks() -> None:
    assert choose_threads(WHOLE_MACHINE, 1, {}).intra_op == 64
    assert choose_threads(WHOLE_MACHINE, 4, {}).intra_op == 16
    assert choose_threads(WHOLE_MACHINE, 128, {}).intra_op == 1
    assert "shared by 4 ranks" in choose_threads(WHOLE_MACHINE, 4, {}).source


def test_a_rank_the_launcher_bound_keeps_its_own_cpus() -> None:
    pinned = CpuBudget(cpus=16, bound=True, why="affinity 16 of 64 CPUs")
    assert choose_threads(pinned, 4, {}).intra_op == 16


def test_cores_busy_with_other_work_get_no_thread() -> None:
    def budget(idle: float, bound: bool = False) -> CpuBudget:
        return CpuBudget(cpus=8, bound=bound, idle=idle, why="x")

    assert choose_threads(budget(8.0), 1, {}).intra_op == 8
    assert choose_threads(budget(5.9), 1, {}).intra_op == 6  # a little noise in the look
    assert choose_threads(budget(5.6), 1, {}).intra_op == 5
    assert choose_threads(budget(0.0), 1, {}).intra_op == 1  # everything busy: one thread, never 0
    assert choose_threads(budget(6.0), 2, {}).intra_op == 3
    assert choose_threads(budget(3.0, bound=True), 4, {}).intra_op == 3
    assert choose_threads(budget(0.5), 1, {"OMP_NUM_THREADS": "8"}).intra_op == 8


def test_idle_time_is_read_for_this_process_s_cpus_only(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  30 0 0 30 0 0 0 0 0 0\ncpu0 10 0 0 10 0 0 0 0 0 0\ncpu1 20 0 0 15 5 0 0 0 0 0\nintr 1 2\n"
    )
    assert _cpu_times(stat, {0}) == (10, 20)
    assert _cpu_times(stat, {0, 1}) == (30, 60)
    assert _cpu_times(stat, {7}) is None
    stat.write_text("cpu0 x y\n")
    assert _cpu_times(stat, {0}) is None
    assert idle_cpus({0}, 0.01, tmp_path / "missing") is None
    mask = os.sched_getaffinity(0)
    idle = idle_cpus(mask, 0.05)
    assert idle is None or 0 <= idle <= len(mask)


def test_an_explicit_setting_wins() -> None:
    assert choose_threads(WHOLE_MACHINE, 4, {"OMP_NUM_THREADS": "3"}).intra_op == 3
    assert choose_threads(WHOLE_MACHINE, 4, {"MLHPC_THREADS": "5"}).source == "MLHPC_THREADS=5"
    assert choose_threads(WHOLE_MACHINE, 4, {"OMP_NUM_THREADS": "2", "MLHPC_THREADS": "5"}).intra_op == 2
    assert choose_threads(WHOLE_MACHINE, 4, {"MLHPC_THREADS": "torch"}).intra_op == 0  # torch's default
    # Not a count of 1..count_bound(): one line naming the variable, never a crash (issue 39).
    for value in ("0", "4,2", "²", "100000"):
        with pytest.raises(ConfigError, match=f"OMP_NUM_THREADS={value} is not a thread count"):
            choose_threads(WHOLE_MACHINE, 4, {"OMP_NUM_THREADS": value})
    assert choose_threads(WHOLE_MACHINE, 4, {"OMP_NUM_THREADS": " "}).intra_op == 16  # empty: unset


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096), st.booleans(), st.integers(0, 1024), st.floats(0, 5000))
def test_always_at_least_one_thread_and_never_more_than_the_cpus(
    cpus: int, bound: bool, ranks: int, idle: float
) -> None:
    choice = choose_threads(CpuBudget(cpus=cpus, bound=bound, why="x"), ranks, {})
    assert 1 <= choice.intra_op <= cpus and choice.inter_op == 1
    choice = choose_threads(CpuBudget(cpus=cpus, bound=bound, idle=idle, why="x"), ranks, {})
    assert 1 <= choice.intra_op <= cpus and choice.inter_op == 1


def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(lines)
    return root, proc


def test_cgroup_v2_quota_is_the_tightest_up_the_path(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "0::/job/step\n",
        {"job/cpu.max": "400000 100000\n", "job/step/cpu.max": "max 100000\n", "cpu.max": "max 100000"},
    )
    assert cgroup_cpu_quota(root, proc) == 4.0
    root, proc = _cgroup(tmp_path / "none", "0::/a\n", {"a/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(root, proc) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "4:memory:/x\n1:cpu,cpuacct:/docker/abc\n",
        {"cpu/docker/abc/cpu.cfs_quota_us": "250000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_cpu_quota(root, proc) == 2.5
    root, proc = _cgroup(tmp_path / "unlimited", "1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n"})
    assert cgroup_cpu_quota(root, proc) is None


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=50))
def test_damaged_cgroup_files_mean_no_quota_never_a_crash(
    tmp_path_factory, lines: bytes, cpu_max: bytes
) -> None:
    tmp = tmp_path_factory.mktemp("cg")
    (tmp / "root" / "x").mkdir(parents=True)
    (tmp / "root" / "x" / "cpu.max").write_bytes(cpu_max)
    (tmp / "proc").write_bytes(b"0::/x\n" + lines)
    quota = cgroup_cpu_quota(tmp / "root", tmp / "proc")
    assert quota is None or quota == quota  # a number or nothing


def test_this_process_budget_is_its_affinity() -> None:
    budget = cpu_budget()
    assert 1 <= budget.cpus <= len(os.sched_getaffinity(0))


def test_openmp_waits_briefly_unless_the_user_said_otherwise() -> None:
    env: dict[str, str] = {"KMP_BLOCKTIME": "200"}
    wait_briefly(env)
    assert env == {"KMP_BLOCKTIME": "200", "GOMP_SPINCOUNT": "3000"}


@pytest.mark.parametrize(
    ("affinity", "env", "threads"),
    [({0}, {}, 1), ({0, 1}, {"OMP_NUM_THREADS": "1"}, 1), ({0, 1}, {"MLHPC_THREADS": "1"}, 1)],
)
def test_a_real_process_sets_torch_from_its_choice(
    affinity: set[int], env: dict[str, str], threads: int
) -> None:
    """In a fresh process: mlhpc's import sets the spin count before torch loads, and
    init_distributed applies and records the choice."""
    if not affinity <= os.sched_getaffinity(0):
        pytest.skip(f"this machine cannot pin to CPUs {sorted(affinity)}")
    code = (
        f"import os; os.sched_setaffinity(0, {affinity!r})\n"
        "import mlhpc, torch\n"
        "from mlhpc.common.cluster.distributed import init_distributed\n"
        "ctx = init_distributed('auto', 'cpu')\n"
        "print(torch.get_num_threads(), ctx.threads.intra_op, os.environ['GOMP_SPINCOUNT'])\n"
    )
    ours = ("OMP_NUM_THREADS", "MLHPC_THREADS", "GOMP_SPINCOUNT")
    clean = {k: v for k, v in os.environ.items() if k not in ours}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(threads), str(threads), "3000"]
