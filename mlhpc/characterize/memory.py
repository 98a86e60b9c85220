"""The memory level: what fills memory at a training step's peak (weights, gradients, optimizer state,
activations, ...) at several batch sizes, beside the peak measured, and how it grows per sample."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from mlhpc.characterize.workload import PHASES, Workload

MEASURED_STEP = "mlhpc::measured_step"
"""The label of the one step whose peak is reported."""


@dataclass(frozen=True)
class MemoryCategories:
    """Bytes live at the step's peak, as torch.profiler's memory profiler categorises tensors (in
    MemoryLevel.growth: bytes added per added sample)."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    """Forward outputs computed from the batch and still held (what backward saved)."""
    temporaries: float
    """Tensors made and freed inside one operator."""
    inputs: float
    """The batch (and the targets)."""
    autograd_detail: float
    """Backward outputs other than parameter gradients: gradients of activations in flight."""
    uncategorized: float
    """Allocations the profiler tied to no tensor (a library's workspace, such as oneDNN's reorder
    buffers inside a convolution) or that no rule placed."""


@dataclass(frozen=True)
class MemoryPoint:
    """One batch size's step peak."""

    batch_size: int
    categories: MemoryCategories
    categorized_bytes: int
    """Sum of the categories at the categorised peak."""
    measured_peak_bytes: int
    """CUDA: torch.cuda.max_memory_allocated over the step. CPU: the highest live total of the
    profiler's allocation events during the step (it tracked every allocation since the workload was
    built)."""
    unattributed_bytes: int
    """measured_peak_bytes - categorized_bytes: memory the process holds outside the workload's
    tensors, or a transient peak between the categoriser's samples."""
    peak_phase: str
    """forward, backward, optimizer, or other: where the categorised peak fell."""


@dataclass(frozen=True)
class MemoryLevel:
    """A step's peak memory at each batch size, and its growth per added sample."""

    device: str
    points: tuple[MemoryPoint, ...]
    growth: MemoryCategories | None
    """Least-squares slope over the batch sizes, bytes per sample; None with one batch size."""
    measured_growth: float | None
    """The same slope for measured_peak_bytes."""


def memory_breakdown(
    make_workload: Callable[[int], Workload], batch_sizes: Sequence[int], *, warmup: int = 1
) -> MemoryLevel:
    """Build a workload per batch size, run `warmup` steps (so optimizer state exists) and measure the
    next one. Profiling starts before the workload is built, so that every tensor it holds is known."""
    if warmup < 1:
        raise ValueError(
            f"warmup={warmup}: the measured step must follow a first one, so that optimizer state exists"
        )
    if not batch_sizes or len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError(f"batch_sizes={list(batch_sizes)}: give one or more distinct batch sizes")
    measured = [_measure(make_workload, bs, warmup) for bs in sorted(batch_sizes)]
    points = tuple(point for _, point in measured)
    multi = len(points) > 1
    xs = [p.batch_size for p in points]
    return MemoryLevel(
        device=measured[0][0],
        points=points,
        growth=_slopes(points) if multi else None,
        measured_growth=_slope(xs, [p.measured_peak_bytes for p in points]) if multi else None,
    )


def _measure(
    make_workload: Callable[[int], Workload], batch_size: int, warmup: int
) -> tuple[str, MemoryPoint]:
    gc.collect()  # the previous batch size's workload must not count in this one's peak
    # The device is not known before the workload is built, so profile both CPU and (if present) CUDA.
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    with profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=True) as prof:
        workload = make_workload(batch_size)
        for _ in range(warmup):
            workload.step()
        workload.synchronize()
        cuda = workload.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(workload.device)
        with record_function(MEASURED_STEP):
            workload.step()
            workload.synchronize()
    timeline = categorised_timeline(prof, workload.device)
    peak = max(timeline.within, key=lambda i: sum(timeline.sizes[i].values()))
    at_peak = timeline.sizes[peak]
    categorized = sum(at_peak.values())
    measured = torch.cuda.max_memory_allocated(workload.device) if cuda else timeline.allocated_peak
    return str(workload.device), MemoryPoint(
        batch_size=batch_size,
        categories=MemoryCategories(**{f.name: at_peak.get(f.name, 0) for f in fields(MemoryCategories)}),
        categorized_bytes=categorized,
        measured_peak_bytes=measured,
        unattributed_bytes=measured - categorized,
        peak_phase=timeline.phase_at(timeline.times_ns[peak]),
    )


@dataclass(frozen=True)
class CategorisedTimeline:
    """The memory profiler's timeline of one device, cut to the measured step."""

    times_ns: tuple[int, ...]
    sizes: tuple[dict[str, int], ...]
    """Live bytes per category (MemoryCategories' field names) after each time."""
    within: tuple[int, ...]
    """Indices of the times inside the measured step (with the state it started from)."""
    allocated_peak: int
    """Highest live total of the allocation events inside the step (from the allocator's count)."""
    phases: tuple[tuple[str, int, int], ...]
    """(phase, start ns, end ns) of the measured step's labelled ranges."""

    def phase_at(self, t_ns: int) -> str:
        return next((name for name, lo, hi in self.phases if lo <= t_ns <= hi), "other")


def categorised_timeline(prof: profile, device: torch.device) -> CategorisedTimeline:
    """torch.profiler's memory categoriser (a private API behind profile.export_memory_timeline)
    read for one device. The only place this package touches it."""
    try:
        from torch._C._profiler import _EventType
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

        memory_profile = prof._memory_profile()
        times_us, sizes = MemoryProfileTimeline(memory_profile)._coalesce_timeline(_device_str(device))
        tree = memory_profile._op_tree
    except (ImportError, AttributeError, TypeError) as e:
        raise RuntimeError(
            f"torch {torch.__version__} has no usable memory categoriser "
            "(torch.profiler._memory_profiler.MemoryProfile); the memory level is written against torch 2.14"
        ) from e
    names = {c: (c.name.lower() if c is not None else "uncategorized") for c in _CATEGORY_TO_INDEX}
    names = {c: _FIELD.get(n, n) for c, n in names.items()}
    step = next(e for e in tree.dfs() if e.name == MEASURED_STEP)
    lo, hi = step.start_time_ns, step.end_time_ns
    times_ns = tuple(t * 1000 for t in times_us)  # the categoriser rounds to microseconds
    before = [i for i, t in enumerate(times_ns) if t < lo]
    within = (*before[-1:], *(i for i, t in enumerate(times_ns) if lo <= t <= hi))
    dev = torch.device(_device_str(device))
    allocs = [e for e in tree.dfs() if e.typed[0] == _EventType.Allocation and e.typed[1].device == dev]
    return CategorisedTimeline(
        times_ns=times_ns,
        sizes=tuple({names[c]: row[i + 1] for c, i in _CATEGORY_TO_INDEX.items()} for row in sizes),
        within=within,
        allocated_peak=_allocated_peak(allocs, lo, hi),
        phases=tuple(
            (e.name, e.start_time_ns, e.end_time_ns)
            for e in tree.dfs()
            if e.name in PHASES and lo <= e.start_time_ns <= hi
        ),
    )


_FIELD = {
    "parameter": "parameters",
    "gradient": "gradients",
    "activation": "activations",
    "temporary": "temporaries",
    "input": "inputs",
}


def _device_str(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _allocated_peak(allocs: list, lo: int, hi: int) -> int:
    """Used on CPU. Its allocator counts only what it saw allocated while a profiler ran, from the
    residue of earlier profiles: subtract what it held before this profile's first event."""
    if not allocs:
        return 0
    first = allocs[0].typed[1]
    base = first.total_allocated - first.alloc_size
    return max(e.typed[1].total_allocated for e in allocs if lo <= e.start_time_ns <= hi) - base


def _slopes(points: tuple[MemoryPoint, ...]) -> MemoryCategories:
    xs = [p.batch_size for p in points]
    return MemoryCategories(
        **{
            f.name: _slope(xs, [getattr(p.categories, f.name) for p in points])
            for f in fields(MemoryCategories)
        }
    )


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
