"""The analytic level: what one training sample costs by construction (FLOPs, bytes saved for the
backward, bytes on disk, compulsory memory traffic, gradient bytes to all-reduce), measured from
shapes on the meta device, with no timing and no data.

Per-sample figures are exact for costs affine in the batch: the step is counted at batch b and 2b,
the per-sample figure is the difference over b, and what does not grow with the batch (batch
norm's saved statistics) is reported as a fixed cost per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mlhpc.characterize.bench_workload import single_process_context
from mlhpc.characterize.layer_flops import LayerCall
from mlhpc.characterize.step_count import StepCount, count_step
from mlhpc.characterize.workload import parameter_bytes, trainable_bytes
from mlhpc.common.contract.registry import Benchmark
from mlhpc.common.errors import ConfigError

Number = int | float


class NotOnMeta(ConfigError):
    """The model cannot be counted on the meta device (data-dependent operations, such as Faster
    R-CNN's proposal sampling): count it on the CPU instead."""


TRAFFIC_FORMULA = (
    "per sample, micro-batch B, optimizer batch B_opt (B x gradient accumulation steps): "
    "input_read = batch tensors + the ones autograd keeps (read again in the backward); "
    "activation_write = activation_read = saved activations per sample + fixed saved bytes / B; "
    "weight_read_forward = weight_read_backward = parameter and buffer bytes / B; "
    "gradient_write = trainable bytes / B; "
    "optimizer_read = (2 x trainable + optimizer state bytes) / B_opt (parameter, gradient, state); "
    "optimizer_write = (trainable + optimizer state bytes) / B_opt (parameter, state)"
)


@dataclass(frozen=True)
class LayerRow:
    """One convolution or linear module: its calls in a step, FLOPs per training sample."""

    name: str
    kind: str
    calls: int
    """Calls per step (a module used twice counts twice)."""
    groups: int
    weight_shape: list[int]
    input_shape: list[int]
    """Of its first call at the larger measured batch."""
    output_shape: list[int]
    forward_flops: Number
    backward_weight_flops: Number
    backward_input_flops: Number


@dataclass(frozen=True)
class Traffic:
    """Compulsory memory traffic of one training step per sample (bytes): what must cross between
    the device's memory and its compute at least once. The formula is TRAFFIC_FORMULA."""

    micro_batch_size: int
    optimizer_batch_size: int
    input_read: Number
    activation_write: Number
    activation_read: Number
    weight_read_forward: Number
    weight_read_backward: Number
    gradient_write: Number
    optimizer_read: Number
    optimizer_write: Number
    total: Number
    formula: str = TRAFFIC_FORMULA


@dataclass(frozen=True)
class Analytic:
    """The analytic level of characterize.json (dataclasses.asdict); units in the names: flops
    (multiply-add = 2), bytes, bytes_per_s; per_sample is per training sample."""

    benchmark: str
    device: str
    """Where the step was counted: meta (shapes only) or cpu (models with data-dependent shapes)."""
    measured_batch_sizes: list[int]
    """b and 2b: each per-sample figure is (count at 2b - count at b) / b."""
    forward_flops_per_sample: Number
    """Layer formulas (convolutions, transposed convolutions, linear layers; bias, activations,
    normalisation, pooling and the loss aside, as FlopCounterMode leaves them)."""
    backward_flops_per_sample: Number
    """Weight gradients plus input gradients (those only where the input requires grad)."""
    backward_weight_flops_per_sample: Number
    backward_input_flops_per_sample: Number
    training_flops_per_sample: Number
    """Forward plus backward."""
    counter_forward_flops_per_sample: Number
    """torch.utils.flop_counter.FlopCounterMode over the forward: equal to the formulas'."""
    counter_backward_flops_per_sample: Number
    """FlopCounterMode over the backward; it counts a grouped convolution's weight gradient
    `groups` times over, the excess below."""
    counter_grouped_weight_grad_excess_flops_per_sample: Number
    """counter_backward - backward: FlopCounterMode's overcount of grouped (depthwise) weights."""
    parameter_count: int
    parameter_bytes: int
    """Parameters and buffers as the model holds them."""
    trainable_bytes: int
    """Parameters that train: the gradient bytes of a step."""
    optimizer_state_bytes: int
    """The optimizer's state after one step (momentum, Adam moments)."""
    activation_bytes_per_sample: Number
    """Bytes autograd saves for the backward (saved_tensors_hooks during the forward): each saved
    storage once, parameters, buffers and the batch aside (step_count.StepCount.activation_bytes)."""
    activation_float_values_per_sample: Number
    """Floating-point values among the saved activations (indices and masks aside)."""
    activation_bytes_fixed: Number
    """Saved bytes per step that do not grow with the batch (batch norm's statistics)."""
    saved_input_bytes_per_sample: Number
    """Bytes of the batch that autograd also keeps for the backward (read twice)."""
    input_bytes_per_sample: Number
    """Every tensor of the batch fed to compute_loss, labels included."""
    model_input_values_per_sample: Number
    """Values of the model's input tensor (the fields, without labels)."""
    sample_bytes: int | None
    """One sample in the dataset's on-disk format (benchmark's sample_bytes); None without it."""
    traffic: Traffic
    compulsory_traffic_bytes_per_sample: Number
    """traffic.total."""
    flop_per_sample_byte: float | None
    """Training FLOPs over sample_bytes."""
    flop_per_memory_byte: float
    """Training FLOPs over the compulsory traffic."""
    allreduce_bytes_per_step: int
    """Gradient bytes a data-parallel step all-reduces (trainable_bytes); see ring_allreduce_bytes."""
    input_bandwidth_per_pflops: float | None
    """Bytes/s of samples that 1 PFLOP/s of sustained training consumes: sample_bytes x 1e15 /
    training FLOPs per sample."""
    layers: list[LayerRow] = field(default_factory=list)


def ring_allreduce_bytes(nbytes: int, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `nbytes`: 2 (n - 1) / n x nbytes."""
    return 2 * (world_size - 1) / world_size * nbytes if world_size > 1 else 0.0


def analyze(
    bench: Benchmark,
    cfg: Any,
    *,
    device: str | torch.device = "meta",
    batch_size: int | None = None,
    world_size: int = 1,
    measure_batch: int = 2,
) -> Analytic:
    """The analytic level of `bench` at `cfg`. `batch_size`: the per-rank micro-batch that weight
    and optimizer traffic are amortised over (default: the config's loop at `world_size` ranks);
    `measure_batch`: b of the counts at b and 2b (above 1: batch norm trains on more than one)."""
    if bench.example_batch is None:
        raise ConfigError(
            f"benchmark {bench.name} has no example_batch function, which the analytic level "
            "needs; see docs/ADDING_A_BENCHMARK.md"
        )
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)  # Faster R-CNN samples proposals: same counts each time
        with torch.device(device):  # built in place: a full-size model never exists on the host
            model = bench.build_model(cfg)
        model.train()
        lo, hi = (_count(bench, cfg, model, b, device) for b in (measure_batch, 2 * measure_batch))
        state_bytes = _optimizer_state_bytes(bench, cfg, model, device)
    micro, opt_batch = _traffic_batches(cfg, batch_size, world_size, measure_batch)
    sample_bytes = bench.sample_bytes(cfg) if bench.sample_bytes is not None else None
    return _assemble(bench, model, (lo, hi), state_bytes, (micro, opt_batch), sample_bytes, device)


def _count(bench: Benchmark, cfg: Any, model: torch.nn.Module, batch: int, device: torch.device) -> StepCount:
    example = bench.example_batch(cfg, batch, device)  # type: ignore[misc]
    try:
        return count_step(model, bench.compute_loss, example)
    except (NotImplementedError, RuntimeError) as e:
        if device.type != "meta":
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NotOnMeta(
            f"{bench.name} does not run on the meta device ({first}); count it with "
            "device='cpu', on a config small enough for this host"
        ) from e


def _optimizer_state_bytes(bench: Benchmark, cfg: Any, model: torch.nn.Module, device: torch.device) -> int:
    """The state one optimizer step creates, on the gradients the counts left (meta: sizes only)."""
    optimizer, _ = bench.build_optimizer(cfg, model, single_process_context(device), 1)
    optimizer.step()
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    )


def _traffic_batches(cfg: Any, batch_size: int | None, world_size: int, fallback: int) -> tuple[int, int]:
    loop = getattr(cfg, "loop", None)
    accumulation = getattr(loop, "gradient_accumulation_steps", 1)
    if batch_size is None:
        batch_size = loop.local_batch_size(world_size) if loop is not None else fallback
    return batch_size, batch_size * accumulation


def _per_sample(lo: int, hi: int, batch: int) -> Number:
    value = (hi - lo) / batch
    return int(value) if value.is_integer() else value


_PER_SAMPLE = (
    "forward_flops",
    "backward_weight_flops",
    "backward_input_flops",
    "counter_forward_flops",
    "counter_backward_flops",
    "activation_bytes",
    "activation_float_values",
    "saved_input_bytes",
    "input_bytes",
    "model_input_values",
)


def _assemble(
    bench: Benchmark,
    model: torch.nn.Module,
    counts: tuple[StepCount, StepCount],
    state_bytes: int,
    batches: tuple[int, int],
    sample_bytes: int | None,
    device: torch.device,
) -> Analytic:
    lo, hi = counts
    per = {name: _per_sample(getattr(lo, name), getattr(hi, name), lo.batch_size) for name in _PER_SAMPLE}
    backward = per["backward_weight_flops"] + per["backward_input_flops"]
    training = per["forward_flops"] + backward
    fixed = lo.activation_bytes - per["activation_bytes"] * lo.batch_size
    trainable, weights = trainable_bytes(model), parameter_bytes(model)
    traffic = _traffic(
        input_bytes=per["input_bytes"] + per["saved_input_bytes"],
        activation=per["activation_bytes"] + fixed / batches[0],
        weights=weights,
        trainable=trainable,
        state=state_bytes,
        batches=batches,
    )
    return Analytic(
        benchmark=bench.name,
        device=device.type,
        measured_batch_sizes=[lo.batch_size, hi.batch_size],
        forward_flops_per_sample=per["forward_flops"],
        backward_flops_per_sample=backward,
        backward_weight_flops_per_sample=per["backward_weight_flops"],
        backward_input_flops_per_sample=per["backward_input_flops"],
        training_flops_per_sample=training,
        counter_forward_flops_per_sample=per["counter_forward_flops"],
        counter_backward_flops_per_sample=per["counter_backward_flops"],
        counter_grouped_weight_grad_excess_flops_per_sample=per["counter_backward_flops"] - backward,
        parameter_count=sum(p.numel() for p in model.parameters()),
        parameter_bytes=weights,
        trainable_bytes=trainable,
        optimizer_state_bytes=state_bytes,
        activation_bytes_per_sample=per["activation_bytes"],
        activation_float_values_per_sample=per["activation_float_values"],
        activation_bytes_fixed=fixed,
        saved_input_bytes_per_sample=per["saved_input_bytes"],
        input_bytes_per_sample=per["input_bytes"],
        model_input_values_per_sample=per["model_input_values"],
        sample_bytes=sample_bytes,
        traffic=traffic,
        compulsory_traffic_bytes_per_sample=traffic.total,
        flop_per_sample_byte=training / sample_bytes if sample_bytes else None,
        flop_per_memory_byte=training / traffic.total,
        allreduce_bytes_per_step=trainable,
        input_bandwidth_per_pflops=sample_bytes * 1e15 / training if sample_bytes and training else None,
        layers=layer_rows(lo, hi),
    )


def _traffic(
    *,
    input_bytes: Number,
    activation: Number,
    weights: int,
    trainable: int,
    state: int,
    batches: tuple[int, int],
) -> Traffic:
    micro, opt_batch = batches
    terms = {
        "input_read": input_bytes,
        "activation_write": activation,
        "activation_read": activation,
        "weight_read_forward": weights / micro,
        "weight_read_backward": weights / micro,
        "gradient_write": trainable / micro,
        "optimizer_read": (2 * trainable + state) / opt_batch,
        "optimizer_write": (trainable + state) / opt_batch,
    }
    return Traffic(micro_batch_size=micro, optimizer_batch_size=opt_batch, total=sum(terms.values()), **terms)


def layer_rows(lo: StepCount, hi: StepCount) -> list[LayerRow]:
    """One row per convolution or linear module, in call order, FLOPs per sample from the counts
    at b and 2b."""
    small = _by_layer(lo.calls)
    rows = []
    for name, calls in _by_layer(hi.calls).items():
        first = calls[0]
        forward, weight, inputs = (
            _per_sample(_total(small.get(name, []), attr), _total(calls, attr), lo.batch_size)
            for attr in ("forward_flops", "weight_grad_flops", "input_grad_flops")
        )
        rows.append(
            LayerRow(
                name=name,
                kind=first.kind,
                calls=len(calls),
                groups=first.groups,
                weight_shape=list(first.weight_shape),
                input_shape=list(first.input_shape),
                output_shape=list(first.output_shape),
                forward_flops=forward,
                backward_weight_flops=weight,
                backward_input_flops=inputs,
            )
        )
    return rows


def _total(calls: list[LayerCall], attr: str) -> int:
    return sum(getattr(call, attr) for call in calls)


def _by_layer(calls: tuple[LayerCall, ...]) -> dict[str, list[LayerCall]]:
    grouped: dict[str, list[LayerCall]] = {}
    for call in calls:
        grouped.setdefault(call.name, []).append(call)
    return grouped
