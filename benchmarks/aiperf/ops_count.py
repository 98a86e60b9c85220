"""AIPerf's analytic operation count of an NNI graph: per-image forward (eval) and forward + backward
(train) operations, layer by layer as AIPerf's `scripts/reports/profiler.py` counts them, quirks kept.

Source: AI-HPC-Research-Team/AIPerf, commit 96e752c (tests/data/aiperf/profiler.py is a copy; the
tests run it and compare). No torch here: the submission checker uses this on a login node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

KERNEL_OVERRIDE_AFTER = 175
"""Layers past this many (1-based position in layer_list) count with the trial's tuned kernel size.

profiler.py's `count > 175`: ResNet-50's seed graph has 174 layers, so only layers network
morphism appended late in the list take the hyperparameter's kernel size."""

KINDS = ("conv", "dense", "batch_norm", "relu", "add", "concatenate", "softmax", "max_pool", "avg_pool")
"""Kinds in profiler.py's summation order (kept: float sums depend on the order)."""

_Ops = tuple[str, float, float]  # (kind, forward ops, backward ops) of one layer


@dataclass(frozen=True)
class OpsPerImage:
    """Operations one image costs (AIPerf's `eval_per_image`, `train_per_image`)."""

    eval: float
    """Forward pass."""
    train: float
    """Forward and backward pass."""


def ops_per_image(graph_json: Mapping[str, Any], kernel_size: int) -> OpsPerImage:
    """AIPerf's per-image operations of a graph trained with hyperparameter `kernel_size`;
    the same floats as profiler.py's `cal_trial_flops_per_image`."""
    totals = _kind_totals(graph_json, kernel_size)
    forward = sum(totals[kind][0] for kind in KINDS)
    backward = sum(totals[kind][1] for kind in KINDS)
    return OpsPerImage(eval=forward, train=backward + forward)


def ops_per_image_table(graph_json: Mapping[str, Any], kernel_size: int) -> dict[str, OpsPerImage]:
    """The same count split by layer kind (keys in `KINDS` order), for a report."""
    totals = _kind_totals(graph_json, kernel_size)
    return {kind: OpsPerImage(eval=fw, train=bw + fw) for kind, (fw, bw) in totals.items()}


def _kind_totals(graph: Mapping[str, Any], kernel_size: int) -> dict[str, tuple[float, float]]:
    shapes = _node_shapes(graph)
    totals: dict[str, tuple[float, float]] = {kind: (0, 0) for kind in KINDS}
    convs_seen = 0
    for position, (_, layer) in enumerate(graph["layer_list"], start=1):
        name = layer[0]
        if name == "StubConv2d":
            kernel = int(kernel_size) if position > KERNEL_OVERRIDE_AFTER else layer[5]
            ops = _conv(layer, shapes, kernel, first=convs_seen == 0)
            convs_seen += 1
        elif name in _COUNTERS:
            ops = _COUNTERS[name](layer, shapes)
        else:
            # Dropout, Concatenate (its inputs already have the output's shape), Flatten, ...:
            # profiler.py counts nothing for any other layer.
            continue
        for kind, fw, bw in ops:
            totals[kind] = (totals[kind][0] + fw, totals[kind][1] + bw)
    return totals


def _node_shapes(graph: Mapping[str, Any]) -> list[list[int]]:
    # profiler.py looks a node's shape up by its position in node_list, so ids must be positions.
    shapes = []
    for position, (node_id, shape) in enumerate(graph["node_list"]):
        if node_id != position:
            raise ValueError(f"node_list entry {position} has id {node_id}; AIPerf reads shapes by position")
        shapes.append(list(shape))
    return shapes


def _shape(shapes: Sequence[list[int]], node: int, layer: Sequence[Any], rank: int = 3) -> list[int]:
    if not (isinstance(node, Integral) and 0 <= node < len(shapes)):  # numpy ints too
        raise ValueError(f"{layer[0]} {layer} reads node {node}; node_list has {len(shapes)} nodes")
    shape = shapes[node]
    if len(shape) != rank:
        raise ValueError(f"{layer[0]} {layer} needs a rank-{rank} (height, width, channels) input; "
                         f"node {node} has shape {shape}")
    return shape


def _conv(layer: Sequence[Any], shapes: Sequence[list[int]], kernel: int, first: bool) -> list[_Ops]:
    """2 x out^2 x k^2 x in x out forward. Backward k^2 x in x out x (4 out^2 + 2): the weight gradient
    and the input gradient (2 out^2 each) and the update (+2); the first conv skips the input
    gradient (the image needs none), so it has 2 out^2 + 2."""
    _, in_node, _, in_channels, out_channels, _, stride, padding = layer[:8]
    height = _shape(shapes, in_node, layer)[0]
    # Square maps, as profiler.py assumes; the graph's padding even when the kernel is overridden.
    out = (height + 2 * padding - kernel) // stride + 1
    if out <= 0:
        raise ValueError(f"conv {layer} with kernel {kernel} on a {height}-pixel input has no output")
    # profiler.py's expression order, so that float sizes would round the same way.
    forward = (out * out * kernel * kernel * in_channels) * out_channels * 2
    weights = kernel * kernel * in_channels * out_channels
    backward = weights * (2 * out * out + 2) if first else weights * (4 * out * out + 2)
    return [("conv", forward, backward)]


def _dense(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """2 x in x out forward, 4 x in x out + 2 x (in + 1) x out backward; profiler.py counts the
    classifier's softmax (13 out - 1, no backward) with every Dense layer, not as its own layer."""
    in_units, out_units = int(layer[3]), layer[4]
    dense = ("dense", in_units * out_units * 2, 2 * (2 * in_units * out_units) + 2 * (in_units + 1) * out_units)
    softmax = ("softmax", out_units * 8 + (out_units - 1) * 1 + out_units * 4, 0)
    return [dense, softmax]


def _batch_norm(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """7 x H x W x C forward (a multiply-add, an add and a divide of weight 4 per value); backward is
    profiler.py's constant (29 + 7) / 1 = 36.0 per layer, whatever its size."""
    height, width, _ = _shape(shapes, layer[1], layer)
    channels = layer[3]
    values = height * width * channels
    return [("batch_norm", values * 2 + values * 1 + values * 4, (29.0 * 1 + 7) / 1)]


def _relu(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """One comparison per input value; no backward."""
    height, width, channels = _shape(shapes, layer[1], layer)
    return [("relu", height * width * channels, 0)]


def _add(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """One add per value, counted only when both inputs have the same shape (profiler.py skips an
    Add of unequal shapes); no backward."""
    first, second = layer[1]
    shape = _shape(shapes, first, layer)
    if shape != _shape(shapes, second, layer):
        return []
    height, width, channels = shape
    return [("add", height * width * channels, 0)]


def _pooling(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """H x W x C x k^2 / s^2 comparisons (a float, divided in profiler.py's order); no backward."""
    height, width, channels = _shape(shapes, layer[1], layer)
    kernel, stride = layer[3], layer[4]
    return [("max_pool", 1.0 * height * width * channels * kernel * kernel / stride / stride, 0)]


def _global_pooling(layer: Sequence[Any], shapes: Sequence[list[int]]) -> list[_Ops]:
    """(H x W - 1) adds and one divide (weight 4) per channel; no backward."""
    height, width, channels = _shape(shapes, layer[1], layer)
    return [("avg_pool", (height * width - 1) * channels * 1 + channels * 4, 0)]


_COUNTERS = {
    "StubDense": _dense,
    "StubBatchNormalization2d": _batch_norm,
    "StubReLU": _relu,
    "StubAdd": _add,
    "StubPooling2d": _pooling,
    "StubGlobalPooling2d": _global_pooling,
}
