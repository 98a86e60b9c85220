"""How many processes this machine can hold: the bound on a count from outside that becomes
local processes (`mlhpc run --instances` launches one rank per instance here), from its CPUs
(affinity and cgroup quota) and its memory (physical, cut by a cgroup v2 `memory.max`).
Torch-free: the dry run checks it too."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.cluster.threads import cpu_budget

RANKS_PER_CPU = 4
"""More ranks than this per CPU only wait on each other (and each holds a Python and its model)."""
RANK_MEMORY_BYTES = 1 << 30
"""The least a training rank holds (a Python with torch loaded is about 0.5-0.9 GiB)."""


@dataclass(frozen=True)
class LocalLimit:
    """The most local processes this machine holds, and why (for the one line)."""

    most: int
    why: str


def memory_bytes(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This machine's memory, or its cgroup's `memory.max` when lower; None when unknown."""
    try:
        total: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    try:
        limit = (cgroup_root / "memory.max").read_text(encoding="ascii").strip()
        if limit.isdigit() and (total is None or int(limit) < total):
            total = int(limit)
    except OSError:
        pass
    return total


def local_process_limit() -> LocalLimit:
    """The most ranks one machine runs at once: RANKS_PER_CPU per usable CPU, and one per
    RANK_MEMORY_BYTES of memory."""
    cpus = cpu_budget(look_s=0).cpus
    most, why = cpus * RANKS_PER_CPU, f"{cpus} CPUs x {RANKS_PER_CPU}"
    memory = memory_bytes()
    if memory is not None and memory // RANK_MEMORY_BYTES < most:
        most, why = (
            max(1, memory // RANK_MEMORY_BYTES),
            f"{memory / (1 << 30):.1f} GiB of memory at 1 GiB a rank",
        )
    return LocalLimit(most, why)
