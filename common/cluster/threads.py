"""How many CPU threads a rank's torch uses, chosen from the CPUs it may really use, and how its
OpenMP threads wait.

torch's default, one thread per core of the machine, each spinning for ~300,000 iterations at
every barrier, collapses wherever the cores are shared: a login node, a workstation, ranks or
tests beside each other. With both cores of a 2-core machine busy, one CosmoFlow mini seed took
145-181 s instead of 12-14 s (perf/RESULTS.md, "Threads"). So:

- the thread count comes from the CPUs this process may run on (its affinity mask and its
  cgroup's CPU quota) less those that other work keeps busy (a 0.3 s look at /proc/stat when
  the rank starts), shared among the ranks on the node unless the launcher already bound each
  rank to its own CPUs; an explicit `OMP_NUM_THREADS` always wins, and `MLHPC_THREADS=N` sets it
  for mlhpc alone (`MLHPC_THREADS=torch` keeps torch's own default, for comparisons);
- OpenMP threads spin briefly, then sleep (`GOMP_SPINCOUNT` for GNU OpenMP, which torch's wheels
  use; `KMP_BLOCKTIME` for Intel and LLVM OpenMP). The runtime reads these once, when torch is
  first imported, so `wait_briefly()` (spin.py, kept light) runs from `mlhpc/__init__.py`; a
  value the user set wins.

Torch-free except `apply`, which imports torch when it is called.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.cluster.spin import SHORT_SPIN as SHORT_SPIN
from mlhpc.common.cluster.spin import wait_briefly as wait_briefly
from mlhpc.common.printable import shown


@dataclass(frozen=True, kw_only=True)
class CpuBudget:
    """The CPUs one process may use, and what limits them."""

    cpus: int
    """Whole CPUs this process may run on (at least 1)."""
    bound: bool
    """True when the affinity mask is smaller than the machine: a launcher pinned this rank."""
    idle: float | None = None
    """Of those CPUs, how many sat idle over a short look before training (None: not measured)."""
    why: str
    """Where the number comes from, for the record, e.g. "affinity 64 of 64, cgroup quota 8"."""


@dataclass(frozen=True)
class ThreadChoice:
    """The threads one rank runs torch with, and why."""

    intra_op: int
    inter_op: int
    source: str
    """One line for the run's record: what decided `intra_op`."""

    def as_record(self) -> dict[str, object]:
        return {"intra_op": self.intra_op, "inter_op": self.inter_op, "source": self.source}


def cgroup_cpu_quota(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPUs this process's cgroup may use per period (`cpu.max`, or v1's CFS quota), the
    tightest along its path; None when no quota is set or none can be read."""
    quotas: list[float] = []
    try:
        lines = proc_cgroup.read_text(encoding="utf-8", errors="replace").splitlines()[:64]
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2: cpu.max in each folder up the path
            folder = root / path.strip("/")
            while True:
                quotas.extend(_v2_quota(folder / "cpu.max"))
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "cpu" in controllers.split(","):
            base = root / "cpu" / path.strip("/")
            for folder in (base, root / "cpu"):
                quotas.extend(_v1_quota(folder))
    return min(quotas) if quotas else None


def _v2_quota(path: Path) -> list[float]:
    try:
        quota, period = path.read_text(encoding="ascii").split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError, ZeroDivisionError):
        return []


def _v1_quota(folder: Path) -> list[float]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="ascii"))
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="ascii"))
        return [quota / period] if quota > 0 and period > 0 else []
    except (OSError, ValueError):
        return []


def _cpu_times(stat: Path, cpus: set[int]) -> tuple[int, int] | None:
    """Idle and total jiffies of `cpus`, summed, from /proc/stat; None when unreadable."""
    idle = total = 0
    try:
        lines = stat.read_text(encoding="ascii", errors="replace").splitlines()
        for line in lines:
            name, *fields = line.split()
            if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
                continue
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle += ticks[3] + ticks[4]
            total += sum(ticks)
    except (OSError, ValueError, IndexError):
        return None
    return (idle, total) if total > 0 else None


def idle_cpus(cpus: set[int], look_s: float = 0.3, stat: Path = Path("/proc/stat")) -> float | None:
    """How many of `cpus` sat idle over `look_s` seconds (other users' jobs, other ranks, tests
    beside us); None where /proc/stat cannot tell."""
    before = _cpu_times(stat, cpus)
    time.sleep(look_s)
    after = _cpu_times(stat, cpus)
    if before is None or after is None or after[1] <= before[1]:
        return None
    return len(cpus) * (after[0] - before[0]) / (after[1] - before[1])


def cpu_budget(look_s: float = 0.3) -> CpuBudget:
    """This process's CPUs: its affinity mask, cut by its cgroup's quota, and how many of them
    are idle now (a look of `look_s` seconds; 0: don't look)."""
    machine = os.cpu_count() or 1
    try:
        mask = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        mask = set(range(machine))
    quota = cgroup_cpu_quota()
    cpus = len(mask) if quota is None else max(1, min(len(mask), int(quota)))
    idle = idle_cpus(mask, look_s) if look_s > 0 else None
    why = f"affinity {len(mask)} of {machine} CPUs" + ("" if quota is None else f", cgroup quota {quota:g}")
    if idle is not None:
        why += f", {idle:.1f} idle"
    return CpuBudget(cpus=max(1, cpus), bound=len(mask) < machine, idle=idle, why=why)


def usable(budget: CpuBudget) -> int:
    """The CPUs worth a thread: the budget, less those busy with other work. A thread on a
    busy core stalls every barrier of the others (a 3x slower seed with a neighbour's job)."""
    if budget.idle is None:
        return budget.cpus
    return max(1, min(budget.cpus, math.floor(budget.idle + 0.25)))


def count_bound() -> int:
    """The most threads or worker processes one rank may ask for: 4 per CPU of the machine, at
    least 64. More only thrash (100,000 threads segfaulted torch; as many workers hit the pid limit)."""
    return max(64, 4 * (os.cpu_count() or 1))


def env_count(name: str, text: str) -> int:
    """`text`, the value of the environment variable `name`, as a count of 1..count_bound(); a
    ConfigError naming the variable otherwise (`²`, `-1`, `1e3`, a 400-digit number)."""
    from mlhpc.common.errors import ConfigError

    most = count_bound()
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or not 1 <= int(value) <= most:
        raise ConfigError(
            f"{name}={shown(text[:40])} is not a thread count from 1 to {most} (4 per CPU of this "
            f"machine, at least 64); set {name} to a whole number in that range, or unset it"
        )
    return int(value)


def explicit_choice(environ: Mapping[str, str]) -> ThreadChoice | None:
    """What the user set (OMP_NUM_THREADS wins, then MLHPC_THREADS), or None (pure); a ConfigError
    for a value that is no count in 1..count_bound(). An empty value counts as unset."""
    for name in ("OMP_NUM_THREADS", "MLHPC_THREADS"):
        value = environ.get(name, "").strip()
        if value and not (name == "MLHPC_THREADS" and value == "torch"):
            return ThreadChoice(env_count(name, value), 1, f"{name}={value}")
    if environ.get("MLHPC_THREADS", "").strip() == "torch":
        return ThreadChoice(0, 0, "MLHPC_THREADS=torch: torch's defaults")
    return None


def choose_threads(budget: CpuBudget, ranks_on_node: int, environ: Mapping[str, str]) -> ThreadChoice:
    """The threads for one rank (pure): what the user set, else the budget's CPUs, shared by the
    node's ranks unless the launcher bound each rank already."""
    explicit = explicit_choice(environ)
    if explicit is not None:
        return explicit
    ranks = max(1, ranks_on_node)
    if budget.bound or ranks == 1:
        intra, shared = usable(budget), ""
    else:
        intra, shared = max(1, usable(budget) // ranks), f", shared by {ranks} ranks on the node"
    return ThreadChoice(intra, 1, f"{budget.why}{shared}")


def apply(choice: ThreadChoice) -> ThreadChoice:
    """Set torch's thread pools (0 keeps torch's default); the choice as really applied."""
    import torch

    if choice.intra_op > 0:
        torch.set_num_threads(choice.intra_op)
    if choice.inter_op > 0:
        # Set once per process, before any inter-op work: a second call keeps the first.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(choice.inter_op)
    return ThreadChoice(torch.get_num_threads(), torch.get_num_interop_threads(), choice.source)


def configure_threads(ranks_on_node: int, environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """Choose and apply this rank's threads; the 0.3 s look at the CPUs only when the user set
    nothing."""
    environ = os.environ if environ is None else environ
    explicit = explicit_choice(environ)
    return apply(explicit or choose_threads(cpu_budget(), ranks_on_node, environ))
