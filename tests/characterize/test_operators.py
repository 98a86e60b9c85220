"""The operator level: each op in its phase, counted once, with FLOPs that match the layer formulas in
forward and backward, and bytes that match the tensors it read and wrote."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

from mlhpc.characterize.op_cost import op_cost
from mlhpc.characterize.operators import OperatorLevel, OperatorStat, profile_operators
from mlhpc.characterize.workload import PHASES
from tests.helpers.characterize_models import (
    CHANNELS,
    CLASSES,
    IMAGE,
    IN_CHANNELS,
    conv_forward_flops,
    conv_workload,
)

BATCH = 4
FLOAT = 4


@pytest.fixture(scope="module")
def level() -> OperatorLevel:
    return profile_operators(conv_workload(BATCH), steps=2)


def row(level: OperatorLevel, phase: str, op: str) -> OperatorStat:
    return next(o for o in level.operators if (o.phase, o.op) == (phase, op))


def test_flops_match_the_layer_formulas_forward_and_backward(level: OperatorLevel) -> None:
    conv1 = conv_forward_flops(BATCH, IN_CHANNELS, CHANNELS)
    conv2 = conv_forward_flops(BATCH, CHANNELS, CHANNELS)
    linear = 2 * BATCH * CHANNELS * IMAGE * IMAGE * CLASSES
    assert row(level, "forward", "aten::conv2d").flops_per_step == conv1 + conv2
    # conv1's input needs no gradient: its backward computes the weight gradient only
    assert row(level, "backward", "aten::convolution_backward").flops_per_step == conv1 + 2 * conv2
    assert row(level, "forward", "aten::linear").flops_per_step == linear
    assert row(level, "backward", "aten::mm").flops_per_step == 2 * linear
    assert level.flops_per_step == 2 * conv1 + 3 * conv2 + 3 * linear
    assert level.bytes_inputs_only == ()


def test_the_profiler_alone_counts_no_backward_convolution_flops() -> None:
    """Why op_cost replays calls under FlopCounterMode: torch.profiler's with_flops gives 0 for
    aten::convolution_backward (and for conv3d). If this fails, torch learnt to count them."""
    workload = conv_workload(BATCH)
    workload.step()
    with profile(record_shapes=True, with_flops=True) as prof:
        workload.step()
    backward = [e for e in prof.events() if e.name == "aten::convolution_backward"]
    assert backward and all(not e.flops for e in backward)
    assert all(op_cost(e).flops > 0 for e in backward)


def test_ops_land_in_their_phase(level: OperatorLevel) -> None:
    where = {(o.phase, o.op) for o in level.operators}
    assert ("forward", "aten::conv2d") in where
    assert ("backward", "aten::convolution_backward") in where
    assert {p for p, op in where if op in ("aten::conv2d", "aten::linear")} == {"forward"}
    optimizer_ops = {op for p, op in where if p == "optimizer"}
    assert {"aten::add_", "aten::mul_"} <= optimizer_ops  # SGD momentum: buf.mul_(m).add_(g); p.add_(buf)
    assert [p.phase for p in level.phases] == [*PHASES, "other"]


def test_children_are_not_counted_twice(level: OperatorLevel) -> None:
    """Top-level ops only: aten::conv2d's aten::convolution / mkldnn_convolution are inside its time.
    Counting them too would make a phase's op time exceed the phase itself."""
    ops = {o.op for o in level.operators}
    assert not ops & {"aten::convolution", "aten::_convolution", "aten::addmm", "aten::mkldnn_convolution"}
    for phase in level.phases[:3]:
        assert 0 < phase.op_seconds <= phase.range_seconds
    assert sum(o.seconds_per_step for o in level.operators) <= level.step_seconds
    assert sum(o.step_share for o in level.operators) <= 1


def test_bytes_are_inputs_plus_outputs_and_views_move_none(level: OperatorLevel) -> None:
    x1 = BATCH * IN_CHANNELS * IMAGE * IMAGE
    x2 = BATCH * CHANNELS * IMAGE * IMAGE  # conv2's input, and each conv's output
    w1, w2 = CHANNELS * IN_CHANNELS * 9 + CHANNELS, CHANNELS * CHANNELS * 9 + CHANNELS
    conv = row(level, "forward", "aten::conv2d")
    assert conv.bytes_per_step == FLOAT * (x1 + w1 + x2) + FLOAT * (x2 + w2 + x2)
    assert conv.intensity == conv.flops_per_step / conv.bytes_per_step
    assert row(level, "forward", "aten::flatten").bytes_per_step == 0
    assert row(level, "forward", "aten::relu").intensity is None  # no FLOPs counted for elementwise


def test_grouped_convolution_backward_is_twice_its_forward() -> None:
    """op_cost corrects FlopCounterMode, which counts a grouped convolution's weight gradient as if
    the convolution were not grouped (groups x too many)."""
    level = profile_operators(conv_workload(BATCH, groups=CHANNELS), steps=1)
    grouped = conv_forward_flops(BATCH, 1, CHANNELS)  # depthwise: one input channel per output
    conv1 = conv_forward_flops(BATCH, IN_CHANNELS, CHANNELS)
    assert row(level, "forward", "aten::conv2d").flops_per_step == conv1 + grouped
    assert row(level, "backward", "aten::convolution_backward").flops_per_step == conv1 + 2 * grouped

    x = torch.randn(BATCH, CHANNELS, IMAGE, IMAGE, requires_grad=True)
    conv = torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=CHANNELS)
    out = conv(x)
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() > 2 * grouped  # the overcount being corrected


def test_a_call_that_cannot_be_replayed_is_costed_by_the_call_it_made() -> None:
    """conv2d(padding="same"): the profiler keeps no string argument, but its aten::convolution child
    was recorded in full."""
    x, w = torch.randn(BATCH, IN_CHANNELS, IMAGE, IMAGE), torch.randn(CHANNELS, IN_CHANNELS, 3, 3)
    with profile(record_shapes=True) as prof:
        torch.nn.functional.conv2d(x, w, padding="same")
        torch.nn.functional.conv2d(x, w, padding=1)
    same, explicit = (op_cost(e) for e in prof.events() if e.name == "aten::conv2d")
    assert same == explicit
    assert same.complete and same.flops == conv_forward_flops(BATCH, IN_CHANNELS, CHANNELS)


def test_level_is_json(level: OperatorLevel) -> None:
    data = json.loads(json.dumps(dataclasses.asdict(level)))
    assert data["time_basis"] == "cpu" and data["steps"] == 2
    assert {"phase", "op", "seconds_per_step", "flops_per_s", "intensity"} <= set(data["operators"][0])


def test_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="steps=0"):
        profile_operators(conv_workload(BATCH), steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_uses_kernel_time_and_places_backward_by_time() -> None:
    """On CUDA autograd runs backward on its own device thread, outside the "backward" range's thread."""
    level = profile_operators(conv_workload(BATCH, device="cuda"), steps=2)
    assert level.time_basis == "cuda"
    backward = row(level, "backward", "aten::convolution_backward")
    assert backward.seconds_per_step > 0
    assert backward.flops_per_step == conv_forward_flops(
        BATCH, IN_CHANNELS, CHANNELS
    ) + 2 * conv_forward_flops(BATCH, CHANNELS, CHANNELS)
