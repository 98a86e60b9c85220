"""Function-preserving network morphisms (deeper, wider, skip) on a Graph and its GraphNet weights.

Like NNI's, a morph appends its new layers and nodes at the end of the lists and renumbers nothing,
so the parent's weights keep their `layer_<id>` names in the child and AIPerf's tuned kernel (layer
ids >= 175) reaches the layers morphism added. Each morph returns (child graph, child weights)
computing what the parent computes, in eval mode, up to float rounding. A morph that does not apply
where it is asked raises ValueError saying why; random_morph picks one that applies.

`weights` is build_model(graph).state_dict() (without the tuned kernel); the child's dict is new,
sharing the tensors of untouched layers with the parent's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import torch

from mlhpc.benchmarks.aiperf.graph import (
    ADD,
    BN,
    BN_EPS,
    CONCAT,
    CONV,
    DENSE,
    GLOBAL_POOL,
    POOL,
    RELU,
    Graph,
    Layer,
    Shape,
    check,
    output_shape,
)

Weights = dict[str, torch.Tensor]

DEEPER_KERNELS = (3, 5)
MAX_CONV_CHANNELS = 65536  # graph.ARG_RANGES' channel limit
# Layers a channel passes through unchanged: widening before them widens their output too.
_CHANNELWISE = (RELU, POOL, GLOBAL_POOL)
_SKIP_TRIES = 20  # target nodes tried by random_morph before it falls back to another kind


class _Edit:
    """A copy of a graph's lists that only grows at the end, plus the child's weights."""

    def __init__(self, graph: Graph, weights: Mapping[str, torch.Tensor]) -> None:
        self.graph = graph
        self.nodes: list[Shape] = list(graph.nodes)
        self.layers: list[Layer] = list(graph.layers)
        self.weights: Weights = dict(weights)
        floats = [t for t in weights.values() if t.is_floating_point()]
        self.like = floats[0] if floats else torch.zeros(())

    def add(self, kind: str, inputs: tuple[int, ...], *args: int) -> tuple[int, int]:
        """Append a layer writing a new node; returns (layer id, node id)."""
        layer = Layer(kind, inputs, len(self.nodes), tuple(args))
        self.nodes.append(output_shape(layer, [self.nodes[i] for i in inputs]))
        self.layers.append(layer)
        return len(self.layers) - 1, layer.output

    def reroute(self, readers: tuple[int, ...], old: int, new: int) -> None:
        """Make the layers `readers` read node `new` where they read `old`."""
        for lid in readers:
            layer = self.layers[lid]
            inputs = tuple(new if node == old else node for node in layer.inputs)
            self.layers[lid] = Layer(layer.kind, inputs, layer.output, layer.args)

    def set_arg(self, lid: int, index: int, value: int) -> None:
        layer = self.layers[lid]
        args = (*layer.args[:index], value, *layer.args[index + 1 :])
        self.layers[lid] = Layer(layer.kind, layer.inputs, layer.output, args)

    def set_channels(self, node: int, channels: int) -> None:
        self.nodes[node] = (*self.nodes[node][:-1], channels)

    def tensor(self, lid: int, name: str) -> torch.Tensor:
        key = f"layer_{lid}.{name}"
        if key not in self.weights:
            raise ValueError(f"weights lack {key!r}; pass build_model(graph).state_dict()")
        return self.weights[key]

    def put(self, lid: int, name: str, value: torch.Tensor) -> None:
        self.weights[f"layer_{lid}.{name}"] = value

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.like.dtype, device=self.like.device)

    def identity_bn(self, lid: int, channels: int) -> None:
        """Eval-mode identity: (x - 0) / sqrt(1 + eps) * sqrt(1 + eps) + 0."""
        self.put(lid, "weight", self.zeros(channels) + math.sqrt(1.0 + BN_EPS))
        self.put(lid, "bias", self.zeros(channels))
        self.put(lid, "running_mean", self.zeros(channels))
        self.put(lid, "running_var", self.zeros(channels) + 1.0)
        self.put(lid, "num_batches_tracked", torch.zeros((), dtype=torch.long, device=self.like.device))

    def done(self) -> tuple[Graph, Weights]:
        child = Graph(self.graph.input_shape, tuple(self.nodes), tuple(self.layers))
        check(child)  # a GraphError is a ValueError: a morph that would break the graph refuses
        return child, self.weights


def deeper(
    graph: Graph,
    weights: Mapping[str, torch.Tensor],
    after_node: int,
    rng: random.Random,
    kernel_size: int | None = None,
) -> tuple[Graph, Weights]:
    """Insert conv (k x k, "same", identity) + BN (identity) + ReLU after `after_node`, a ReLU's
    (H, W, C) output; its readers read the new ReLU. k is `kernel_size`, else 3 or 5 at random."""
    _require_relu_map(graph, after_node)
    k = kernel_size if kernel_size is not None else rng.choice(DEEPER_KERNELS)
    if k < 1 or k % 2 == 0:
        raise ValueError(f"kernel_size={k}; expected an odd kernel so 'same' padding keeps the shape")
    channels = graph.nodes[after_node][2]
    edit = _Edit(graph, weights)
    conv, x = edit.add(CONV, (after_node,), channels, channels, k, 1, k // 2)
    norm, x = edit.add(BN, (x,), channels)
    _, x = edit.add(RELU, (x,))
    edit.reroute(graph.consumers[after_node], after_node, x)
    # The input is a ReLU's, so non-negative: identity conv, identity BN and ReLU pass it unchanged.
    kernel = edit.zeros(channels, channels, k, k)
    kernel[torch.arange(channels), torch.arange(channels), k // 2, k // 2] = 1.0
    edit.put(conv, "weight", kernel)
    edit.put(conv, "bias", edit.zeros(channels))
    edit.identity_bn(norm, channels)
    return edit.done()


def wider(
    graph: Graph,
    weights: Mapping[str, torch.Tensor],
    conv_layer_id: int,
    new_channels: int,
    rng: random.Random,
) -> tuple[Graph, Weights]:
    """Net2Net wider: give conv `conv_layer_id` `new_channels` filters, copies of randomly chosen
    ones, where it feeds BN -> ReLU -> (ReLU, max/global pooling)* -> Conv or Dense layers only; the
    readers' weights for a copied channel are divided by its number of copies."""
    bn_id, relu_id = _wider_pattern(graph, conv_layer_id)
    conv = graph.layers[conv_layer_id]
    old = conv.args[1]
    if not old < new_channels <= MAX_CONV_CHANNELS:
        raise ValueError(f"new_channels={new_channels}; expected {old + 1}..{MAX_CONV_CHANNELS}")
    passed, readers = _channel_readers(graph, graph.layers[relu_id].output)
    source = list(range(old)) + [rng.randrange(old) for _ in range(new_channels - old)]
    copies = torch.bincount(torch.tensor(source), minlength=old)
    index = torch.tensor(source)

    edit = _Edit(graph, weights)
    edit.set_arg(conv_layer_id, 1, new_channels)
    edit.set_arg(bn_id, 0, new_channels)
    for name in ("weight", "bias"):
        edit.put(conv_layer_id, name, edit.tensor(conv_layer_id, name)[index].clone())
    for name in ("weight", "bias", "running_mean", "running_var"):
        edit.put(bn_id, name, edit.tensor(bn_id, name)[index].clone())
    for node in (conv.output, graph.layers[bn_id].output, graph.layers[relu_id].output, *passed):
        edit.set_channels(node, new_channels)
    for lid in readers:
        edit.set_arg(lid, 0, new_channels)
        weight = edit.tensor(lid, "weight")
        scale = (1.0 / copies[index]).to(weight.dtype).to(weight.device)
        shape = (1, -1, 1, 1) if weight.dim() == 4 else (1, -1)
        edit.put(lid, "weight", weight[:, index] * scale.view(shape))
    return edit.done()


def skip(
    graph: Graph,
    weights: Mapping[str, torch.Tensor],
    from_node: int,
    to_node: int,
    rng: random.Random,
    how: str = "add",
) -> tuple[Graph, Weights]:
    """A skip connection from `from_node` to the later `to_node`, both ReLU (H, W, C) outputs, with
    `from_node` among `to_node`'s ancestors and its H, W a stride 1..8 of to_node's. "add": a zero
    1x1 conv (that stride) of from_node added to to_node. "concat": a 1x1 conv of from_node (small
    random weights, so it can train) concatenated after to_node's channels, with zero weights for
    the new channels in the readers, which must be Conv or Dense (through ReLU and pooling)."""
    if how not in ("add", "concat"):
        raise ValueError(f"how={how!r}; expected 'add' or 'concat'")
    _require_relu_map(graph, from_node)
    _require_relu_map(graph, to_node)
    if from_node not in graph.ancestors(to_node):
        raise ValueError(f"node {from_node} is not an ancestor of node {to_node}; a skip must go forward")
    stride = _skip_stride(graph.nodes[from_node], graph.nodes[to_node])
    if stride is None:
        raise ValueError(
            f"node {from_node} {list(graph.nodes[from_node])} cannot be strided to node {to_node}'s "
            f"{list(graph.nodes[to_node])}"
        )
    from_c, to_c = graph.nodes[from_node][2], graph.nodes[to_node][2]
    edit = _Edit(graph, weights)
    if how == "add":
        conv, x = edit.add(CONV, (from_node,), from_c, to_c, 1, stride, 0)
        edit.put(conv, "weight", edit.zeros(to_c, from_c, 1, 1))
        edit.put(conv, "bias", edit.zeros(to_c))
        _, merged = edit.add(ADD, (to_node, x))
        edit.reroute(graph.consumers[to_node], to_node, merged)
        return edit.done()

    passed, readers = _channel_readers(graph, to_node)
    added = from_c
    if to_c + added > MAX_CONV_CHANNELS:
        raise ValueError(f"concatenating {added} channels to node {to_node} passes {MAX_CONV_CHANNELS}")
    conv, x = edit.add(CONV, (from_node,), from_c, added, 1, stride, 0)
    generator = torch.Generator().manual_seed(rng.getrandbits(63))
    kernel = torch.randn((added, from_c, 1, 1), generator=generator) * (0.1 / math.sqrt(from_c))
    edit.put(conv, "weight", kernel.to(edit.like.dtype).to(edit.like.device))
    edit.put(conv, "bias", edit.zeros(added))
    _, merged = edit.add(CONCAT, (to_node, x))
    edit.reroute(graph.consumers[to_node], to_node, merged)
    for node in passed:
        edit.set_channels(node, to_c + added)
    for lid in readers:
        edit.set_arg(lid, 0, to_c + added)
        weight = edit.tensor(lid, "weight")
        extra = edit.zeros(weight.shape[0], added, *weight.shape[2:])
        edit.put(lid, "weight", torch.cat([weight, extra], dim=1))
    return edit.done()


def random_morph(
    graph: Graph, weights: Mapping[str, torch.Tensor], rng: random.Random
) -> tuple[Graph, Weights, str]:
    """One morph chosen at random among those that apply, with random arguments, and a description
    ("deeper after node 17 (3x3)"). Tries the kinds in random order; ValueError if none applies."""
    kinds = ["deeper", "wider", "skip add", "skip concat"]
    rng.shuffle(kinds)
    for kind in kinds:
        found = _random_of_kind(kind, graph, weights, rng)
        if found is not None:
            return found
    raise ValueError("no morph applies: the graph has no ReLU output of shape (H, W, C)")


def _random_of_kind(
    kind: str, graph: Graph, weights: Mapping[str, torch.Tensor], rng: random.Random
) -> tuple[Graph, Weights, str] | None:
    maps = _relu_maps(graph)
    if not maps:
        return None
    if kind == "deeper":
        node = rng.choice(maps)
        k = rng.choice(DEEPER_KERNELS)
        return (*deeper(graph, weights, node, rng, kernel_size=k), f"deeper after node {node} ({k}x{k})")
    if kind == "wider":
        convs = [
            lid for lid, layer in enumerate(graph.layers) if layer.kind == CONV and _can_widen(graph, lid)
        ]
        if not convs:
            return None
        lid = rng.choice(convs)
        old = graph.layers[lid].args[1]
        new = min(old + rng.randint(1, max(1, old // 2)), MAX_CONV_CHANNELS)
        return (*wider(graph, weights, lid, new, rng), f"wider layer {lid} from {old} to {new} channels")
    how = kind.split()[1]
    targets = rng.sample(maps, min(len(maps), _SKIP_TRIES))
    for to_node in targets:
        if how == "concat" and not _concat_ok(graph, to_node):
            continue
        ancestors = graph.ancestors(to_node)
        room = MAX_CONV_CHANNELS - graph.nodes[to_node][2] if how == "concat" else MAX_CONV_CHANNELS
        sources = [
            n
            for n in maps
            if n in ancestors
            and _skip_stride(graph.nodes[n], graph.nodes[to_node]) is not None
            and graph.nodes[n][2] <= room
        ]
        if sources:
            from_node = rng.choice(sources)
            child, child_weights = skip(graph, weights, from_node, to_node, rng, how=how)
            return child, child_weights, f"skip {how} from node {from_node} to node {to_node}"
    return None


def _relu_maps(graph: Graph) -> list[int]:
    return [
        layer.output for layer in graph.layers if layer.kind == RELU and len(graph.nodes[layer.output]) == 3
    ]


def _require_relu_map(graph: Graph, node: int) -> None:
    if not 0 <= node < len(graph.nodes):
        raise ValueError(f"node {node} is not in the graph (0..{len(graph.nodes) - 1})")
    producer = graph.producers.get(node)
    if producer is None or graph.layers[producer].kind != RELU or len(graph.nodes[node]) != 3:
        raise ValueError(f"node {node} is not the (H, W, C) output of a ReLU")


def _wider_pattern(graph: Graph, lid: int) -> tuple[int, int]:
    """(BN id, ReLU id) of conv `lid` -> BN -> ReLU, each read by that layer alone; ValueError if not."""
    if not 0 <= lid < len(graph.layers) or graph.layers[lid].kind != CONV:
        raise ValueError(f"layer {lid} is not a conv")
    chain = []
    node = graph.layers[lid].output
    for kind in (BN, RELU):
        readers = graph.consumers[node]
        if len(readers) != 1 or graph.layers[readers[0]].kind != kind:
            raise ValueError(f"conv {lid} does not feed a lone BN then a lone ReLU")
        chain.append(readers[0])
        node = graph.layers[readers[0]].output
    return chain[0], chain[1]


def _channel_readers(graph: Graph, node: int) -> tuple[list[int], list[int]]:
    """Nodes reached from `node` through channelwise layers, and the Conv/Dense layers reading them;
    ValueError where a path meets another kind of layer or ends the graph."""
    passed: list[int] = []
    readers: list[int] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if not graph.consumers[current]:
            raise ValueError(f"node {current} is the graph's output, whose shape a morph must keep")
        for lid in graph.consumers[current]:
            layer = graph.layers[lid]
            if layer.kind in _CHANNELWISE:
                passed.append(layer.output)
                stack.append(layer.output)
            elif layer.kind in (CONV, DENSE):
                readers.append(lid)
            else:
                raise ValueError(f"node {current} is read by layer {lid} ({layer.kind}), not a Conv or Dense")
    return passed, readers


def _can_widen(graph: Graph, lid: int) -> bool:
    try:
        _, relu_id = _wider_pattern(graph, lid)
        _channel_readers(graph, graph.layers[relu_id].output)
    except ValueError:
        return False
    return graph.layers[lid].args[1] < MAX_CONV_CHANNELS


def _concat_ok(graph: Graph, node: int) -> bool:
    try:
        _channel_readers(graph, node)
    except ValueError:
        return False
    return True


def _skip_stride(source: Shape, target: Shape) -> int | None:
    """The stride of a 1x1 conv taking `source`'s H, W to `target`'s, or None."""
    for stride in range(1, 9):
        if all((s - 1) // stride + 1 == t for s, t in zip(source[:2], target[:2], strict=True)):
            return stride
    return None
