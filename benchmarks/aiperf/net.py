"""The torch network an AIPerf graph describes: module `layer_<id>` is the graph's layer <id>."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mlhpc.benchmarks.aiperf.graph import (
    BN,
    BN_EPS,
    CONCAT,
    CONV,
    DENSE,
    GLOBAL_POOL,
    MERGE_KINDS,
    POOL,
    RELU,
    TUNED_KERNEL_FROM,
    Graph,
    Layer,
)


class _Merge(nn.Module):
    def __init__(self, concat: bool) -> None:
        super().__init__()
        self.concat = concat

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        if self.concat:
            return torch.cat(xs, dim=1)
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out


class _MaxPool(nn.Module):
    """Keras MaxPool2D(padding="same"), as AIPerf trains it, cut to NNI's max(int(d / s), 1) when
    "same" gives one more row or column (odd sizes), so shapes are the graph's."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s = self.kernel_size, self.stride
        h, w = x.shape[-2:]
        pad_h = max((math.ceil(h / s) - 1) * s + k - h, 0)
        pad_w = max((math.ceil(w / s) - 1) * s + k - w, 0)
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=-math.inf)
        return F.max_pool2d(x, k, s)[..., : max(h // s, 1), : max(w // s, 1)]


class _GlobalAvgPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class GraphNet(nn.Module):
    """The graph's network on NCHW input; module `layer_<id>` is layer <id>, so a morphed child's
    state_dict shares its parent's names."""

    def __init__(self, graph: Graph, dropout: float = 0.0, kernel_size: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout}; expected 0 <= dropout < 1")
        if kernel_size is not None and (kernel_size < 1 or kernel_size % 2 == 0):
            raise ValueError(
                f"kernel_size={kernel_size}; expected an odd kernel so 'same' padding keeps shapes"
            )
        self.dropout = dropout
        for lid, layer in enumerate(graph.layers):
            self.add_module(f"layer_{lid}", _module(lid, layer, kernel_size))
        order = graph.topological_order()
        last_use: dict[int, int] = {}
        for step, lid in enumerate(order):
            for node in graph.layers[lid].inputs:
                last_use[node] = step
        # (module name, kind, inputs, output, nodes no later layer reads): freed as soon as possible.
        self._plan = [
            (
                f"layer_{lid}",
                graph.layers[lid].kind,
                graph.layers[lid].inputs,
                graph.layers[lid].output,
                tuple(n for n in set(graph.layers[lid].inputs) if last_use[n] == step),
            )
            for step, lid in enumerate(order)
        ]
        self._output = graph.output_node

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {0: x}
        for name, kind, inputs, output, done in self._plan:
            module = getattr(self, name)
            if kind in MERGE_KINDS:
                values[output] = module(*(values[i] for i in inputs))
            else:
                value = values[inputs[0]]
                if kind == DENSE and self.dropout > 0:
                    value = F.dropout(value, self.dropout, self.training)
                values[output] = module(value)
            for node in done:
                del values[node]
        return values[self._output]


def _module(lid: int, layer: Layer, kernel_size: int | None) -> nn.Module:
    if layer.kind == CONV:
        cin, cout, k, s, p = layer.args
        # Only "same" convolutions take the tuned kernel: with its padding K // 2 the shape is kept.
        if kernel_size is not None and lid >= TUNED_KERNEL_FROM and k > 1 and k % 2 == 1 and p == k // 2:
            k, p = kernel_size, kernel_size // 2
        return nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=True)
    if layer.kind == BN:
        return nn.BatchNorm2d(layer.args[0], eps=BN_EPS)
    if layer.kind == RELU:
        return nn.ReLU()
    if layer.kind == POOL:
        return _MaxPool(layer.args[0], layer.args[1])
    if layer.kind == GLOBAL_POOL:
        return _GlobalAvgPool()
    if layer.kind == DENSE:
        return nn.Linear(layer.args[0], layer.args[1])
    return _Merge(concat=layer.kind == CONCAT)


def build_model(graph: Graph, dropout: float = 0.0, kernel_size: int | None = None) -> GraphNet:
    """The torch network of `graph`: Dropout(`dropout`) before each Dense layer, and AIPerf's tuned
    `kernel_size` on the "same" convolutions at layer ids >= TUNED_KERNEL_FROM (None: the graph's)."""
    return GraphNet(graph, dropout=dropout, kernel_size=kernel_size)
