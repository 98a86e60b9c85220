"""AIPerf's architectures as NNI graph JSON: a validated, immutable Graph (no torch: the checker
reads graphs on a login node; net.py builds the model a graph describes).

A graph is a DAG whose nodes are tensors (channels-last shapes, node 0 the input) and whose layers
are edges; layer i sits at layer_list[i] and node i at node_list[i]. Shapes follow AIPerf's NNI
(src/sdk/pynni/nni/networkmorphism_tuner/layers.py): conv int((d + 2p - k) / s) + 1, max pooling
max(int(d / s), 1), global pooling and Dense 1-D.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from mlhpc.common.errors import DataError

CONV = "StubConv2d"
BN = "StubBatchNormalization2d"
RELU = "StubReLU"
POOL = "StubPooling2d"
GLOBAL_POOL = "StubGlobalPooling2d"
DENSE = "StubDense"
ADD = "StubAdd"
CONCAT = "StubConcatenate"

# Integer arguments after (inputs, output), as NNI's layer_description_extractor writes them.
ARG_NAMES: dict[str, tuple[str, ...]] = {
    CONV: ("in_channels", "out_channels", "kernel_size", "stride", "padding"),
    BN: ("channels",),
    RELU: (),
    POOL: ("kernel_size", "stride", "padding"),
    GLOBAL_POOL: (),
    DENSE: ("in_units", "out_units"),
    ADD: (),
    CONCAT: (),
}
MERGE_KINDS = (ADD, CONCAT)
ARG_RANGES: dict[str, tuple[int, int]] = {
    "in_channels": (1, 65536),
    "out_channels": (1, 65536),
    "channels": (1, 65536),
    "kernel_size": (1, 31),
    "stride": (1, 8),
    "padding": (0, 15),
    "in_units": (1, 1 << 24),
    "out_units": (1, 65536),
}
MAX_LAYERS = 10_000
MAX_SPATIAL = 8192
MAX_CHANNELS = 1 << 24  # 1-D nodes (Dense units, concatenated channels) may exceed a conv's 65536
MAX_MERGE_INPUTS = 16
MAX_NODE_ELEMENTS = 1 << 28  # per image; ResNet-50's largest node at 224 has 802,816
MAX_PARAMETERS = 1_000_000_000  # 4 GB of fp32 weights: a hostile graph must not exhaust memory
# AIPerf's profiler and trials give the tuned kernel to layers with 1-based `count > 175`: the
# layers morphism appended after ResNet-50's 174.
TUNED_KERNEL_FROM = 175
BN_EPS = 1e-5  # torch's BatchNorm2d default; the morphs' identity BN depends on it

# NNI's bookkeeping keys: derived from layer_list, so from_json checks their type and to_json rewrites them.
_BOOKKEEPING = {
    "adj_list": dict,
    "reverse_adj_list": dict,
    "layer_id_to_input_node_ids": dict,
    "layer_id_to_output_node_ids": dict,
    "operation_history": list,
    "vis": (dict, list, type(None)),
    "weighted": bool,
}
_FIX = "fix the graph JSON or regenerate it with mlhpc"

Shape = tuple[int, ...]


class GraphError(ValueError):
    """A graph breaks a structural rule; from_json turns it into a DataError naming the file."""


@dataclass(frozen=True)
class Layer:
    """One NNI layer: its kind (e.g. "StubConv2d"), input node ids, output node id, integer args."""

    kind: str
    inputs: tuple[int, ...]
    output: int
    args: tuple[int, ...] = ()

    def arg(self, name: str) -> int:
        """The argument called `name` in ARG_NAMES (e.g. "out_channels")."""
        return self.args[ARG_NAMES[self.kind].index(name)]

    def to_json(self) -> list[object]:
        """NNI's description: merges take a list of inputs, other layers a single node id."""
        first: object = list(self.inputs) if self.kind in MERGE_KINDS else self.inputs[0]
        return [self.kind, first, self.output, *self.args]


@dataclass(frozen=True)
class Graph:
    """An architecture: input shape (H, W, C), node shapes (nodes[i] of node i), layers by id."""

    input_shape: tuple[int, int, int]
    nodes: tuple[Shape, ...]
    layers: tuple[Layer, ...]

    @classmethod
    def from_json(cls, data: object, source: str) -> Graph:
        """Parse and validate NNI graph JSON; any fault is a one-line DataError naming `source`."""
        where = " ".join(str(source).split())
        try:
            graph = _parse(data)
            check(graph)
        except GraphError as e:
            raise DataError(f"{where}: {e}; {_FIX}") from None
        return graph

    def to_json(self) -> dict[str, object]:
        """NNI's graph JSON with its bookkeeping as a fresh NNI graph writes it (edges by layer id)."""
        adj: dict[str, list[list[int]]] = {str(i): [] for i in range(len(self.nodes))}
        reverse: dict[str, list[list[int]]] = {str(i): [] for i in range(len(self.nodes))}
        for lid, layer in enumerate(self.layers):
            for node in layer.inputs:
                adj[str(node)].append([layer.output, lid])
                reverse[str(layer.output)].append([node, lid])
        return {
            "layer_list": [[lid, layer.to_json()] for lid, layer in enumerate(self.layers)],
            "node_list": [[nid, list(shape)] for nid, shape in enumerate(self.nodes)],
            "input_shape": list(self.input_shape),
            "vis": None,
            "adj_list": adj,
            "reverse_adj_list": reverse,
            "layer_id_to_output_node_ids": {str(i): [lay.output] for i, lay in enumerate(self.layers)},
            "layer_id_to_input_node_ids": {str(i): list(lay.inputs) for i, lay in enumerate(self.layers)},
            "operation_history": [],
            "weighted": False,
        }

    @cached_property
    def producers(self) -> dict[int, int]:
        """Node id -> id of the layer that writes it (every node but the input)."""
        return {layer.output: lid for lid, layer in enumerate(self.layers)}

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Node id -> ids of the layers that read it, ascending."""
        readers: dict[int, list[int]] = {i: [] for i in range(len(self.nodes))}
        for lid, layer in enumerate(self.layers):
            for node in layer.inputs:
                readers.setdefault(node, []).append(lid)
        return {node: tuple(lids) for node, lids in readers.items()}

    @property
    def output_node(self) -> int:
        """The one node no layer reads (check() guarantees there is exactly one)."""
        return next(node for node, readers in self.consumers.items() if not readers)

    def topological_order(self) -> tuple[int, ...]:
        """Layer ids in an order that runs every layer after its inputs (lowest id first among ties)."""
        return self._order

    @cached_property
    def _order(self) -> tuple[int, ...]:
        return _layer_order(self.layers)

    def ancestors(self, node: int) -> set[int]:
        """Ids of the nodes `node` depends on (not itself)."""
        seen: set[int] = set()
        stack = [node]
        while stack:
            lid = self.producers.get(stack.pop())
            if lid is None:
                continue
            for parent in self.layers[lid].inputs:
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return seen


def output_shape(layer: Layer, inputs: Sequence[Shape]) -> Shape:
    """The shape `layer` writes from its input shapes, as AIPerf's NNI computes it; GraphError if
    the layer cannot take those inputs."""
    kind, first = layer.kind, inputs[0]
    if kind in (CONV, BN, POOL, GLOBAL_POOL) and len(first) != 3:
        raise GraphError(f"{kind} needs an (H, W, C) input, got shape {list(first)}")
    if kind == CONV:
        cin, cout, k, s, p = layer.args
        if cin != first[2]:
            raise GraphError(f"in_channels={cin} but its input has {first[2]} channels")
        if first[0] + 2 * p < k or first[1] + 2 * p < k:
            raise GraphError(f"kernel {k} with padding {p} is larger than its {first[0]}x{first[1]} input")
        return ((first[0] + 2 * p - k) // s + 1, (first[1] + 2 * p - k) // s + 1, cout)
    if kind == BN:
        if layer.args[0] != first[2]:
            raise GraphError(f"channels={layer.args[0]} but its input has {first[2]} channels")
        return first
    if kind == RELU:
        return first
    if kind == POOL:
        s = layer.args[1]
        return (max(first[0] // s, 1), max(first[1] // s, 1), first[2])
    if kind == GLOBAL_POOL:
        return (first[2],)
    if kind == DENSE:
        if len(first) != 1:
            raise GraphError(f"Dense needs a 1-D input (put a {GLOBAL_POOL} before it), got {list(first)}")
        if layer.args[0] != first[0]:
            raise GraphError(f"in_units={layer.args[0]} but its input has {first[0]} units")
        return (layer.args[1],)
    if kind == ADD:
        if any(shape != first for shape in inputs):
            raise GraphError(f"Add inputs differ in shape: {[list(s) for s in inputs]}")
        return first
    if kind == CONCAT:
        if any(len(s) != len(first) or s[:-1] != first[:-1] for s in inputs):
            raise GraphError(f"Concatenate inputs differ except in channels: {[list(s) for s in inputs]}")
        channels = sum(s[-1] for s in inputs)
        if channels > MAX_CHANNELS:
            raise GraphError(f"Concatenate makes {channels} channels, over {MAX_CHANNELS}")
        return (*first[:-1], channels)
    raise GraphError(f"unknown layer kind {kind!r}")


def check(graph: Graph) -> None:
    """Raise GraphError unless `graph` is a single-input, single-output DAG whose node shapes are
    the ones its layers compute and whose weights fit under MAX_PARAMETERS."""
    n_nodes = len(graph.nodes)
    if n_nodes != len(graph.layers) + 1:
        raise GraphError(
            f"{n_nodes} nodes for {len(graph.layers)} layers; expected one node per layer plus the input"
        )
    if not 1 <= len(graph.layers) <= MAX_LAYERS:
        raise GraphError(f"{len(graph.layers)} layers; expected 1..{MAX_LAYERS}")
    if graph.nodes[0] != tuple(graph.input_shape):
        raise GraphError(
            f"node 0 has shape {list(graph.nodes[0])} but input_shape is {list(graph.input_shape)}"
        )
    writer: dict[int, int] = {}
    for lid, layer in enumerate(graph.layers):
        for node in (*layer.inputs, layer.output):
            if not 0 <= node < n_nodes:
                raise GraphError(f"layer {lid} names node {node}, but node ids are 0..{n_nodes - 1}")
        if layer.output == 0:
            raise GraphError(f"layer {lid} writes node 0, the input")
        if layer.output in writer:
            raise GraphError(f"node {layer.output} is written by layers {writer[layer.output]} and {lid}")
        writer[layer.output] = lid
    missing = [node for node in range(1, n_nodes) if node not in writer]
    if missing:
        raise GraphError(f"node {missing[0]} is written by no layer")
    shapes: dict[int, Shape] = {0: graph.nodes[0]}
    for lid in _layer_order(graph.layers):
        layer = graph.layers[lid]
        try:
            shape = output_shape(layer, [shapes[node] for node in layer.inputs])
        except GraphError as e:
            raise GraphError(f"layer {lid} ({layer.kind}): {e}") from None
        if shape != graph.nodes[layer.output]:
            raise GraphError(
                f"layer {lid} ({layer.kind}) makes shape {list(shape)} but node_list says node "
                f"{layer.output} is {list(graph.nodes[layer.output])}"
            )
        if math.prod(shape) > MAX_NODE_ELEMENTS:
            raise GraphError(
                f"node {layer.output} of shape {list(shape)} is over {MAX_NODE_ELEMENTS} elements"
            )
        shapes[layer.output] = shape
    outputs = [node for node, readers in graph.consumers.items() if not readers]
    if len(outputs) != 1:
        raise GraphError(
            f"{len(outputs)} nodes are read by no layer ({outputs[:5]}); expected one output node"
        )
    params = parameter_count(graph)
    if params > MAX_PARAMETERS:
        raise GraphError(f"{params} parameters, over the limit of {MAX_PARAMETERS}")


def parameter_count(graph: Graph) -> int:
    """Trainable parameters of build_model(graph): conv and Dense weights and biases, BN scale and shift."""
    total = 0
    for layer in graph.layers:
        if layer.kind == CONV:
            cin, cout, k = layer.args[:3]
            total += cin * cout * k * k + cout
        elif layer.kind == BN:
            total += 2 * layer.args[0]
        elif layer.kind == DENSE:
            total += (layer.args[0] + 1) * layer.args[1]
    return total


def infer_shapes(input_shape: tuple[int, int, int], layers: Sequence[Layer]) -> tuple[Shape, ...]:
    """Node shapes computed from the layers, which must write nodes 1..len(layers); GraphError if not."""
    shapes: dict[int, Shape] = {0: tuple(input_shape)}
    for lid in _layer_order(layers):
        layer = layers[lid]
        shapes[layer.output] = output_shape(layer, [shapes[i] for i in layer.inputs])
    if sorted(shapes) != list(range(len(layers) + 1)):
        raise GraphError("the layers do not write nodes 1..len(layers) once each")
    return tuple(shapes[i] for i in range(len(layers) + 1))


def _layer_order(layers: Sequence[Layer]) -> tuple[int, ...]:
    """Kahn's algorithm over layers from node 0; GraphError on a cycle or a node nothing writes."""
    readers: dict[int, list[int]] = {}
    for lid, layer in enumerate(layers):
        for node in layer.inputs:
            readers.setdefault(node, []).append(lid)
    waiting = [len(layer.inputs) for layer in layers]
    ready: list[int] = []
    for lid in readers.get(0, ()):
        waiting[lid] -= 1
        if waiting[lid] == 0:
            ready.append(lid)
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        lid = heapq.heappop(ready)
        order.append(lid)
        for reader in readers.get(layers[lid].output, ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) != len(layers):
        stuck = sorted(set(range(len(layers))) - set(order))
        raise GraphError(f"layers {stuck[:5]} form a cycle or read a node written inside one")
    return tuple(order)


# --- parsing hostile JSON -------------------------------------------------------------------------


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(value: object, what: str, lo: int, hi: int) -> int:
    # bool is an int subclass and floats like 3.0 are not ids: both are refused.
    if type(value) is not int or not lo <= value <= hi:
        raise GraphError(f"{what} is {_show(value)}; expected an integer in {lo}..{hi}")
    return value


def _list(value: object, what: str, lo: int, hi: int) -> list[object]:
    if not isinstance(value, list) or not lo <= len(value) <= hi:
        size = f"{len(value)} items" if isinstance(value, list) else type(value).__name__
        raise GraphError(f"{what} is {size}; expected a list of {lo}..{hi} items")
    return value


def _shape(value: object, what: str) -> Shape:
    items = _list(value, what, 1, 3)
    if len(items) == 2:
        raise GraphError(f"{what} has 2 dimensions; expected [H, W, C] or [C]")
    if len(items) == 1:
        return (_int(items[0], f"{what}[0]", 1, MAX_CHANNELS),)
    return (
        _int(items[0], f"{what}[0] (H)", 1, MAX_SPATIAL),
        _int(items[1], f"{what}[1] (W)", 1, MAX_SPATIAL),
        _int(items[2], f"{what}[2] (C)", 1, MAX_CHANNELS),
    )


def _layer(value: object, what: str, n_nodes: int) -> Layer:
    entry = _list(value, what, 3, 8)
    kind = entry[0]
    if not isinstance(kind, str) or kind not in ARG_NAMES:
        raise GraphError(f"{what} has kind {_show(kind)}; expected one of {', '.join(ARG_NAMES)}")
    names = ARG_NAMES[kind]
    if len(entry) != 3 + len(names):
        raise GraphError(f"{what} ({kind}) has {len(entry) - 3} arguments; expected {len(names)}: {names}")
    node_hi = n_nodes - 1
    if kind in MERGE_KINDS:
        raw = _list(entry[1], f"{what} inputs", 2, MAX_MERGE_INPUTS)
        inputs = tuple(_int(x, f"{what} input", 0, node_hi) for x in raw)
        if len(set(inputs)) != len(inputs):
            raise GraphError(f"{what} ({kind}) reads node {inputs[0]} twice; expected distinct inputs")
    else:
        inputs = (_int(entry[1], f"{what} input", 0, node_hi),)
    output = _int(entry[2], f"{what} output", 0, node_hi)
    args = tuple(
        _int(x, f"{what} {name}", *ARG_RANGES[name]) for x, name in zip(entry[3:], names, strict=True)
    )
    return Layer(kind, inputs, output, args)


def _parse(data: object) -> Graph:
    if not isinstance(data, dict):
        raise GraphError(f"the graph is a JSON {type(data).__name__}; expected an object")
    unknown = sorted(
        str(k) for k in data if k not in _BOOKKEEPING and k not in ("input_shape", "node_list", "layer_list")
    )
    if unknown:
        raise GraphError(f"unknown key {_show(unknown[0])}")
    for key in ("input_shape", "node_list", "layer_list"):
        if key not in data:
            raise GraphError(f"key {key!r} is missing")
    for key, types in _BOOKKEEPING.items():
        if key in data and not isinstance(data[key], types):
            raise GraphError(f"{key} is a {type(data[key]).__name__}; expected NNI's form")
    shape = _shape(data["input_shape"], "input_shape")
    if len(shape) != 3:
        raise GraphError(f"input_shape is {list(shape)}; expected [H, W, C]")
    raw_nodes = _list(data["node_list"], "node_list", 2, MAX_LAYERS + 1)
    nodes = []
    for i, item in enumerate(raw_nodes):
        entry = _list(item, f"node_list[{i}]", 2, 2)
        _int(entry[0], f"node_list[{i}] id", i, i)
        nodes.append(_shape(entry[1], f"node {i} shape"))
    raw_layers = _list(data["layer_list"], "layer_list", 1, MAX_LAYERS)
    layers = []
    for i, item in enumerate(raw_layers):
        entry = _list(item, f"layer_list[{i}]", 2, 2)
        _int(entry[0], f"layer_list[{i}] id", i, i)
        layers.append(_layer(entry[1], f"layer {i}", len(nodes)))
    return Graph(shape, tuple(nodes), tuple(layers))  # type: ignore[arg-type]
