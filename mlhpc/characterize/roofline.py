"""The roofline level: the machine's measured compute and memory-bandwidth peaks, and each operator (and
the whole workload) placed under the roof they make."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mlhpc.characterize.operators import OperatorLevel

_GEMM_SIZES = {"cpu": (256, 512, 1024, 2048), "cuda": (2048, 4096, 8192)}
_CACHE_MULTIPLE = 8
"""Each streaming array is this many times the last-level cache, so the kernel streams from DRAM/HBM."""
_MEMORY_FRACTION = 8
"""The three streaming arrays together take at most 1/_MEMORY_FRACTION of the free memory."""


@dataclass(frozen=True)
class Peaks:
    """Measured peaks of one device in one dtype."""

    device: str
    dtype: str
    flops_per_s: float
    """Best torch.mm rate over a few square sizes (2 n^3 FLOP per product)."""
    gemm_n: int
    """The matrix size that gave it."""
    bandwidth_bytes_per_s: float
    """Best streaming rate (copy: 2 arrays moved; triad a = b + s*c: 3), bytes read plus written;
    write-allocate traffic is not counted, as in STREAM."""
    stream_flops_per_s: float
    """The triad's own FLOP rate (2 FLOP per element): what a memory-bound kernel achieves."""
    stream_array_bytes: int
    """Bytes of each streaming array."""
    cache_bytes: int
    """Last-level cache the arrays were sized against (CPU L3, GPU L2); 0 where unknown."""
    num_threads: int
    """torch's intra-op threads (CPU); 0 on CUDA."""

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte where the roof turns from memory-bound to compute-bound."""
        return self.flops_per_s / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class RooflinePoint:
    """One operator (or the workload) under the roof."""

    label: str
    """"phase/op" for an operator, "workload" for the analytic point."""
    intensity: float
    """FLOP/byte."""
    flops_per_s: float
    """Achieved."""
    attainable_flops_per_s: float
    """min(peak FLOP/s, bandwidth x intensity)."""
    efficiency: float
    """flops_per_s / attainable_flops_per_s; above 1 where the operator ran from cache faster than
    the DRAM roof allows (small working sets on a CPU), or its bytes overstate its traffic."""
    bound: str
    """"memory" left of the ridge, "compute" right of it."""


@dataclass(frozen=True)
class Roofline:
    """Operators with FLOPs placed under the measured roof."""

    flops_per_s: float
    bandwidth_bytes_per_s: float
    ridge_intensity: float
    """FLOP/byte."""
    points: tuple[RooflinePoint, ...]
    """Highest FLOP share first: the order the operator level reports them in."""
    workload: RooflinePoint | None
    """The analytic level's point (its intensity and achieved FLOP/s), if given."""


def machine_peaks(
    device: torch.device | str, dtype: torch.dtype = torch.float32, *, seconds: float = 2.0
) -> Peaks:
    """Measure peak GEMM FLOP/s and streaming bandwidth on `device`, spending about `seconds` in all."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    flops, gemm_n = _gemm_peak(device, dtype, seconds / 2)
    cache = _cache_bytes(device)
    n = _stream_elements(device, dtype, cache)
    bandwidth, stream_flops = _stream_peak(device, dtype, n, seconds / 2)
    return Peaks(
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        flops_per_s=flops,
        gemm_n=gemm_n,
        bandwidth_bytes_per_s=bandwidth,
        stream_flops_per_s=stream_flops,
        stream_array_bytes=n * dtype.itemsize,
        cache_bytes=cache,
        num_threads=0 if cuda else torch.get_num_threads(),
    )


def place_operators(
    peaks: Peaks, operators: OperatorLevel, workload_point: tuple[float, float] | None = None
) -> Roofline:
    """Place each (phase, operator) with FLOPs, and the workload's (intensity, FLOP/s) if given."""
    points = tuple(
        _place(peaks, f"{o.phase}/{o.op}", o.intensity, o.flops_per_s)
        for o in sorted(operators.operators, key=lambda o: -o.flops_per_step)
        if o.intensity is not None and o.flops_per_s is not None
    )
    return Roofline(
        flops_per_s=peaks.flops_per_s,
        bandwidth_bytes_per_s=peaks.bandwidth_bytes_per_s,
        ridge_intensity=peaks.ridge_intensity,
        points=points,
        workload=_place(peaks, "workload", *workload_point) if workload_point else None,
    )


def _place(peaks: Peaks, label: str, intensity: float, achieved: float) -> RooflinePoint:
    attainable = min(peaks.flops_per_s, peaks.bandwidth_bytes_per_s * intensity)
    return RooflinePoint(
        label=label,
        intensity=intensity,
        flops_per_s=achieved,
        attainable_flops_per_s=attainable,
        efficiency=achieved / attainable,
        bound="memory" if intensity < peaks.ridge_intensity else "compute",
    )


def _gemm_peak(device: torch.device, dtype: torch.dtype, budget_s: float) -> tuple[float, int]:
    best, best_n = 0.0, 0
    sizes = _GEMM_SIZES["cuda" if device.type == "cuda" else "cpu"]
    for n in sizes:
        if best and 2 * n**3 / best > budget_s / len(sizes):
            break  # one product at this size would overrun its share of the budget
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        rate = _best_rate(
            lambda a=a, b=b, out=out: torch.mm(a, b, out=out), 2 * n**3, budget_s / len(sizes), device
        )
        if rate is None:
            break  # one product at this size already exceeds the budget; larger ones would too
        if rate > best:
            best, best_n = rate, n
    return best, best_n


def _stream_peak(device: torch.device, dtype: torch.dtype, n: int, budget_s: float) -> tuple[float, float]:
    a = torch.zeros(n, device=device, dtype=dtype)
    b = torch.ones(n, device=device, dtype=dtype)
    c = torch.ones(n, device=device, dtype=dtype)
    size = dtype.itemsize
    copy = _best_rate(lambda: a.copy_(b), 2 * n * size, budget_s / 2, device) or 0.0
    triad = _best_rate(lambda: torch.add(b, c, alpha=3.0, out=a), 3 * n * size, budget_s / 2, device) or 0.0
    return max(copy, triad), triad / (3 * size) * 2


def _best_rate(fn: Callable[[], object], work: float, budget_s: float, device: torch.device) -> float | None:
    """work / the fastest of as many runs as fit in the budget (after one warm-up run, and at least
    one timed run); None if the warm-up alone overran it."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    start = time.perf_counter()
    fn()
    sync(device)
    if time.perf_counter() - start > budget_s:
        return None
    deadline = start + budget_s
    fastest = _timed(fn, sync, device)
    while time.perf_counter() + fastest < deadline:
        fastest = min(fastest, _timed(fn, sync, device))
    return work / fastest


def _timed(fn: Callable[[], object], sync: Callable, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def _stream_elements(device: torch.device, dtype: torch.dtype, cache: int) -> int:
    """Elements per streaming array: _CACHE_MULTIPLE x the cache (64 MiB if unknown), capped so the
    three arrays take at most 1/_MEMORY_FRACTION of the free memory."""
    want = _CACHE_MULTIPLE * (cache or 64 << 20)
    cap = _free_bytes(device) // (3 * _MEMORY_FRACTION)
    return max(1 << 20, min(want, cap)) // dtype.itemsize


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=0)
