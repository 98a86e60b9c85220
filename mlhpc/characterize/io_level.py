"""The I/O level: how fast the benchmark's own dataset reads one sample from the staged files, and
how many bytes that read really costs (the kernel's per-thread I/O counters, /proc/thread-self/io).

One reader, one sample at a time, as a DataLoader worker reads: the latency of `dataset[i]` (file
opens, decoding and the sample's transform included) and the bytes behind it. Each drawn sample is
read twice: the first touch is what an epoch sees (from the page cache or not, which the kernel's
`read_bytes` tells), the second is certainly served from the page cache."""

from __future__ import annotations

import os
import random
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlhpc.common.errors import ConfigError

IO_COUNTERS = ("/proc/thread-self/io", "/proc/self/io")
"""Where the kernel counts this thread's (else this process's) read bytes; the thread's own file
leaves out what other threads (a heartbeat, a progress bar) read at the same time."""


class SampleDataset(Protocol):
    """A benchmark's map-style training dataset (the `.dataset` of its DataLoader)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def sample_files(self, index: int) -> tuple[Path, ...]: ...


@dataclass(frozen=True)
class IoPass:
    """One pass over the drawn samples, each read once with `dataset[i]`."""

    latency_p50_s: float
    """Median seconds of one `dataset[i]` (open, read, decode, transform)."""
    latency_p99_s: float
    """99th percentile of the same, in seconds (nearest rank)."""
    latency_mean_s: float
    latency_max_s: float
    read_bytes_per_sample: float | None
    """Bytes the read system calls returned per sample (`rchar`: page-cache hits count); None
    where the kernel keeps no I/O counters."""
    storage_bytes_per_sample: float | None
    """Bytes fetched from the storage device per sample (`read_bytes`: cache misses only, in
    whole pages with read-ahead; 0 on tmpfs and on a warm cache); None without counters."""
    bandwidth_bytes_per_s: float | None
    """read_bytes_per_sample × samples / the pass's summed latencies: one reader's bandwidth."""
    samples_per_s: float | None
    """Samples over the pass's summed latencies: one reader, one sample at a time (None: no time)."""


@dataclass(frozen=True)
class IoLevel:
    """Per-sample reads of the benchmark's loader on its staged files."""

    samples: int
    """Distinct samples drawn (without replacement) and read in each pass."""
    dataset_samples: int
    """Samples in the dataset the draws come from."""
    seed: int
    file_bytes_per_sample: float
    """Mean on-disk size of a sample's files (`sample_files`), headers and metadata included."""
    counter: str | None
    """The kernel file the byte counts come from, or None (no /proc: bytes not measured)."""
    evicted: bool
    """Whether the files' cached pages were dropped first (posix_fadvise DONTNEED: no root
    needed, but advisory; without it the first touch may hit the page cache)."""
    first_touch: IoPass
    """The first read of each drawn sample: what an epoch sees."""
    second_touch: IoPass
    """The same samples again, from the page cache: the decode and transform cost alone."""


def measure_io(dataset: SampleDataset, *, samples: int, seed: int, evict: bool = False) -> IoLevel:
    """Read `samples` randomly drawn samples of `dataset` one by one, twice; `evict` first asks the
    kernel to drop the drawn files from the page cache so that the first touch reads the device."""
    total = len(dataset)
    if samples < 1:
        raise ConfigError(f"samples={samples} must be at least 1; read at least one sample")
    if samples > total:
        raise ConfigError(
            f"samples={samples} is more than the dataset's {total} samples; pick at most {total}"
        )
    indices = random.Random(seed).sample(range(total), samples)
    files = [Path(path) for i in indices for path in dataset.sample_files(i)]
    # A first read pays for lazy imports and the code pages it pulls in (megabytes of `read_bytes`
    # on a cold process): done on a sample outside the draw where there is one, before eviction.
    drawn = set(indices)
    dataset[next((i for i in range(total) if i not in drawn), indices[0])]
    evicted = evict and all(_drop_cached_pages(path) for path in files)
    counter = next((path for path in IO_COUNTERS if _io_counters(path) is not None), None)
    first = _read_pass(dataset, indices, counter)
    second = _read_pass(dataset, indices, counter)
    return IoLevel(
        samples=samples,
        dataset_samples=total,
        seed=seed,
        file_bytes_per_sample=sum(path.stat().st_size for path in files) / samples,
        counter=counter,
        evicted=evicted,
        first_touch=first,
        second_touch=second,
    )


def _read_pass(dataset: SampleDataset, indices: Sequence[int], counter: str | None) -> IoPass:
    latencies: list[float] = []
    read_bytes = storage_bytes = 0
    for index in indices:
        before = _io_counters(counter) if counter else None
        start = time.perf_counter()
        dataset[index]
        latencies.append(time.perf_counter() - start)
        after = _io_counters(counter) if counter else None
        if before is not None and after is not None:
            read_bytes += after["rchar"] - before["rchar"]
            storage_bytes += after["read_bytes"] - before["read_bytes"]
    n, busy_s = len(latencies), sum(latencies)
    ordered = sorted(latencies)
    measured = counter is not None
    return IoPass(
        latency_p50_s=_percentile(ordered, 50),
        latency_p99_s=_percentile(ordered, 99),
        latency_mean_s=busy_s / n,
        latency_max_s=ordered[-1],
        read_bytes_per_sample=read_bytes / n if measured else None,
        storage_bytes_per_sample=storage_bytes / n if measured else None,
        bandwidth_bytes_per_s=read_bytes / busy_s if measured and busy_s > 0 else None,
        samples_per_s=n / busy_s if busy_s > 0 else None,
    )


def _percentile(ordered: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile of sorted values: always one of the measured latencies."""
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[int(rank) - 1]


def _io_counters(path: str) -> dict[str, int] | None:
    """The kernel's I/O counters at `path` (rchar, read_bytes, ...), or None where there are none."""
    try:
        with open(path, encoding="ascii") as handle:
            pairs = (line.split(":") for line in handle if ":" in line)
            values = {key.strip(): int(value) for key, value in pairs}
    except (OSError, ValueError):
        return None
    return values if {"rchar", "read_bytes"} <= values.keys() else None


def _drop_cached_pages(path: Path) -> bool:
    """Ask the kernel to forget `path`'s cached pages; whether it could be asked. Dirty pages are
    written first: DONTNEED leaves them in the cache (a freshly generated or staged file)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:  # never blocking on a FIFO named like a sample: only a regular file is touched
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
