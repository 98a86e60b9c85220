"""Keep the memory a CPU training process frees, for its next step, instead of handing it back.

glibc serves every block above its mmap threshold (32 MiB at most: each activation of a full-size
CosmoFlow step) with fresh pages from the kernel and unmaps them on free, so every step faults its
whole working set in again and the kernel zeroes it: 1.6 million page faults and 4.8 of 20
CPU-seconds per CosmoFlow step (batch 4, one thread; perf/RESULTS.md, 2026-11-29). TensorFlow's
allocator keeps what it freed, and torch's own CPU launcher (`torch.backends.xeon.run_cpu`)
preloads jemalloc or tcmalloc with settings that do the same. mlhpc asks glibc for it at run
time (`mallopt`): serve every block from the heap and never trim the heap. The cost is the same as
theirs: the process keeps its peak heap until it exits.

`MLHPC_ALLOCATOR=system` leaves glibc as it is; an allocator preloaded by the user (jemalloc,
tcmalloc, mimalloc in `LD_PRELOAD`) is left alone.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from mlhpc.common.errors import ConfigError

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER = -1  # M_TRIM_THRESHOLD -1: never trim the heap (mallopt(3))
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
CHOICES = ("keep", "system")


def allocator_choice(environ: Mapping[str, str]) -> str:
    """MLHPC_ALLOCATOR (keep, the default, or system); a ConfigError names the variable."""
    choice = environ.get("MLHPC_ALLOCATOR", "keep").strip() or "keep"
    if choice not in CHOICES:
        raise ConfigError(
            f"MLHPC_ALLOCATOR={choice!r}: use keep (the default: freed memory stays with the "
            "process) or system (glibc's own behaviour)"
        )
    return choice


def preloaded_allocator(environ: Mapping[str, str]) -> str | None:
    """The allocator the user preloaded (its library's file name), or None."""
    for library in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        name = os.path.basename(library)
        if any(known in name for known in _PRELOADED):
            return name
    return None


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str:
    """Have glibc keep freed blocks for reuse (see the module); what the process runs with, in one
    line for the run's record."""
    environ = os.environ if environ is None else environ
    if allocator_choice(environ) == "system":
        return "system (MLHPC_ALLOCATOR=system)"
    preloaded = preloaded_allocator(environ)
    if preloaded is not None:
        return f"{preloaded} (LD_PRELOAD)"
    libc = _glibc()
    if libc is None:
        return "system (not glibc)"
    kept = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER) == 1
    return "glibc, freed memory kept" if kept else "system (glibc refused mallopt)"


def _glibc() -> ctypes.CDLL | None:
    # The C library Python itself runs on: no library search (find_library runs ldconfig).
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl does not)
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
