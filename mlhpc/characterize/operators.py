"""The operator level: where a training step's time goes, by aten operator and by phase (forward,
backward, optimizer), with each operator's FLOPs, bytes and arithmetic intensity."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

from mlhpc.characterize.op_cost import op_cost
from mlhpc.characterize.workload import PHASES, Workload

OTHER = "other"
"""The phase of an op that ran in none of the labelled ranges (zero_grad, fetching the batch)."""


@dataclass(frozen=True)
class OperatorStat:
    """One aten operator type within one phase, per training step."""

    phase: str
    """forward, backward, optimizer or other."""
    op: str
    """The aten operator as the caller invoked it, e.g. aten::conv2d, aten::convolution_backward."""
    calls_per_step: float
    seconds_per_step: float
    """Inclusive time of its calls (children included): host time on CPU, kernel time on CUDA."""
    step_share: float
    """seconds_per_step / OperatorLevel.step_seconds."""
    flops_per_step: float
    """FLOPs of its calls (matmul, convolution, attention; see op_cost.OpCost.flops)."""
    flops_per_s: float | None
    """Achieved FLOP/s: flops_per_step / seconds_per_step; None where it has no FLOPs."""
    bytes_per_step: float
    """Input plus output tensor bytes of its calls (see op_cost.OpCost.bytes)."""
    intensity: float | None
    """Arithmetic intensity in FLOP/byte; None where it has no FLOPs or no bytes."""


@dataclass(frozen=True)
class PhaseStat:
    """One phase, per training step."""

    phase: str
    range_seconds: float
    """Host wall time of the phase's labelled range (on CUDA, launch time, not kernel time)."""
    op_seconds: float
    """Sum of its operators' seconds_per_step (host time on CPU, kernel time on CUDA)."""
    step_share: float
    """op_seconds / OperatorLevel.step_seconds."""
    flops: float


@dataclass(frozen=True)
class OperatorLevel:
    """A few profiled training steps, grouped by (phase, aten operator)."""

    device: str
    time_basis: str
    """"cpu" (host time of each op) or "cuda" (time of the kernels each op launched)."""
    steps: int
    """Steps profiled; every per-step figure is their mean."""
    step_seconds: float
    """Wall time of one step (mean over the profiled steps, device synchronised)."""
    flops_per_step: float
    phases: tuple[PhaseStat, ...]
    operators: tuple[OperatorStat, ...]
    """Slowest first."""
    bytes_inputs_only: tuple[str, ...]
    """Operators some of whose calls could not be costed whole (op_cost.OpCost.complete): their
    bytes count recorded inputs only, e.g. aten::cat, whose tensor list the profiler does not record."""


def profile_operators(workload: Workload, *, steps: int, warmup: int = 1) -> OperatorLevel:
    """Profile `steps` training steps after `warmup` unprofiled ones (optimizer state, allocator
    caches and kernel selection settle there)."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be at least 1")
    for _ in range(warmup):
        workload.step()
    workload.synchronize()
    cuda = workload.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    walls = []
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            workload.step()
            workload.synchronize()
            walls.append(time.perf_counter() - start)
    return _summarise(list(prof.events()), cuda, steps, sum(walls) / steps, str(workload.device))


def _summarise(
    events: list[FunctionEvent], cuda: bool, steps: int, step_s: float, device: str
) -> OperatorLevel:
    ranges = _phase_ranges(events)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    flops: dict[tuple[str, str], int] = defaultdict(int)
    nbytes: dict[tuple[str, str], int] = defaultdict(int)
    inputs_only = set()
    for event in _top_level_ops(events):
        key = (_phase_of(event, ranges), event.name)
        cost = op_cost(event)
        calls[key] += 1
        seconds[key] += (event.device_time_total if cuda else event.cpu_time_total) * 1e-6
        flops[key] += cost.flops
        nbytes[key] += cost.bytes
        if not cost.complete:
            inputs_only.add(event.name)
    operators = sorted(
        (
            _operator_stat(
                key, calls[key] / steps, seconds[key] / steps, flops[key] / steps, nbytes[key] / steps, step_s
            )
            for key in calls
        ),
        key=lambda o: -o.seconds_per_step,
    )
    phases = tuple(
        _phase_stat(phase, [o for o in operators if o.phase == phase], ranges.get(phase, []), steps, step_s)
        for phase in (*PHASES, OTHER)
    )
    return OperatorLevel(
        device=device,
        time_basis="cuda" if cuda else "cpu",
        steps=steps,
        step_seconds=step_s,
        flops_per_step=sum(o.flops_per_step for o in operators),
        phases=phases,
        operators=tuple(operators),
        bytes_inputs_only=tuple(sorted(inputs_only)),
    )


def _phase_ranges(events: list[FunctionEvent]) -> dict[str, list[tuple[float, float]]]:
    """Each phase's labelled ranges in microseconds; CPU-side only (CUDA mirrors the annotation on the
    GPU timeline)."""
    ranges: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.name in PHASES and e.device_type.name == "CPU":
            ranges[e.name].append((e.time_range.start, e.time_range.end))
    return ranges


def _top_level_ops(events: list[FunctionEvent]) -> list[FunctionEvent]:
    """aten ops with no aten op above them, so an op's children (aten::conv2d → aten::convolution →
    aten::mkldnn_convolution) are counted once, inside their caller's inclusive time."""
    tops = []
    for e in events:
        if not e.name.startswith("aten::") or e.device_type.name != "CPU":
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            tops.append(e)
    return tops


def _phase_of(event: FunctionEvent, ranges: dict[str, list[tuple[float, float]]]) -> str:
    """The phase whose range holds the op's start. By time, not by parent: on CUDA the backward ops
    run on autograd's device thread, outside the calling thread's "backward" range."""
    start = event.time_range.start
    for phase, spans in ranges.items():
        if any(lo <= start <= hi for lo, hi in spans):
            return phase
    return OTHER


def _operator_stat(
    key: tuple[str, str], calls: float, seconds: float, flops: float, nbytes: float, step_s: float
) -> OperatorStat:
    return OperatorStat(
        phase=key[0],
        op=key[1],
        calls_per_step=calls,
        seconds_per_step=seconds,
        step_share=seconds / step_s,
        flops_per_step=flops,
        flops_per_s=flops / seconds if flops and seconds else None,
        bytes_per_step=nbytes,
        intensity=flops / nbytes if flops and nbytes else None,
    )


def _phase_stat(
    phase: str, operators: list[OperatorStat], spans: list[tuple[float, float]], steps: int, step_s: float
) -> PhaseStat:
    op_seconds = sum(o.seconds_per_step for o in operators)
    return PhaseStat(
        phase=phase,
        range_seconds=sum(hi - lo for lo, hi in spans) * 1e-6 / steps,
        op_seconds=op_seconds,
        step_share=op_seconds / step_s,
        flops=sum(o.flops_per_step for o in operators),
    )
