"""Network morphisms keep the function: the child, built from its graph and weights, computes what
its parent computes (eval mode), and its graph survives the NNI JSON round trip."""

from __future__ import annotations

import json
import random

import pytest
import torch

from mlhpc.benchmarks.aiperf.graph import ADD, BN, CONV, DENSE, RELU, Graph
from mlhpc.benchmarks.aiperf.morph import deeper, random_morph, skip, wider
from mlhpc.benchmarks.aiperf.net import build_model
from mlhpc.benchmarks.aiperf.seed import resnet


def _mini() -> Graph:
    return resnet((32, 32, 3), 10, blocks=(1, 1, 1, 1), width=8, stem="small")


def _random_weights(graph: Graph, seed: int = 0) -> dict[str, torch.Tensor]:
    """Non-trivial weights: BN scales, shifts and running statistics away from their defaults."""
    torch.manual_seed(seed)
    model = build_model(graph)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("running_mean") or name.endswith(".bias"):
                tensor.copy_(torch.randn_like(tensor) * 0.2)
            elif name.endswith("running_var") or (name.endswith(".weight") and tensor.dim() == 1):
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    return {name: t.clone() for name, t in model.state_dict().items()}


def _run(graph: Graph, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    model = build_model(graph).eval()
    model.load_state_dict(weights, strict=True)
    with torch.no_grad():
        return model(x)


def _assert_preserved(parent: Graph, parent_weights: dict, child: Graph, child_weights: dict) -> None:
    assert Graph.from_json(json.loads(json.dumps(child.to_json())), "child") == child
    # Ids are kept: every parent layer still writes its node; new layers and nodes come after.
    assert len(child.layers) > len(parent.layers) or child != parent
    for lid, layer in enumerate(parent.layers):
        assert child.layers[lid].kind == layer.kind and child.layers[lid].output == layer.output
    x = torch.randn(3, 3, *parent.input_shape[:2], generator=torch.Generator().manual_seed(1))
    expected = _run(parent, parent_weights, x)
    assert expected.std() > 0.05  # outputs large enough for the tolerance to mean something
    torch.testing.assert_close(_run(child, child_weights, x), expected, atol=1e-5, rtol=1e-4)


def _relu_nodes(graph: Graph, hw: int | None = None) -> list[int]:
    return [
        layer.output
        for layer in graph.layers
        if layer.kind == RELU
        and len(graph.nodes[layer.output]) == 3
        and hw in (None, graph.nodes[layer.output][0])
    ]


@pytest.fixture(scope="module")
def parent() -> tuple[Graph, dict[str, torch.Tensor]]:
    graph = _mini()
    return graph, _random_weights(graph)


def _snapshot(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in weights.items()}


def test_deeper_keeps_function(parent) -> None:
    graph, weights = parent
    before = _snapshot(weights)
    for node in (3, _relu_nodes(graph, hw=8)[-1]):
        child, child_weights = deeper(graph, weights, node, random.Random(0), kernel_size=3)
        assert [layer.kind for layer in child.layers[-3:]] == [CONV, BN, RELU]
        assert len(child.nodes) == len(graph.nodes) + 3
        _assert_preserved(graph, weights, child, child_weights)
    for name, tensor in before.items():  # the parent's dict is untouched
        assert torch.equal(weights[name], tensor)


def test_wider_keeps_function_into_convs(parent) -> None:
    graph, weights = parent
    conv = next(lid for lid, layer in enumerate(graph.layers) if lid > 2 and layer.kind == CONV)
    child, child_weights = wider(graph, weights, conv, 13, random.Random(3))
    assert child.layers[conv].args[1] == 13 and child.nodes[child.layers[conv].output][2] == 13
    assert len(child.layers) == len(graph.layers)
    _assert_preserved(graph, weights, child, child_weights)


def test_wider_keeps_function_into_dense(parent) -> None:
    # Deeper after the last ReLU makes conv -> BN -> ReLU -> global pool -> Dense.
    graph, weights = parent
    deep, deep_weights = deeper(graph, weights, _relu_nodes(graph)[-1], random.Random(0), kernel_size=3)
    conv = len(deep.layers) - 3
    child, child_weights = wider(deep, deep_weights, conv, 300, random.Random(4))
    assert next(layer for layer in child.layers if layer.kind == DENSE).args[0] == 300
    _assert_preserved(graph, weights, child, child_weights)


def test_wider_refuses_where_the_pattern_fails(parent) -> None:
    graph, weights = parent

    # A block's last conv feeds BN -> Add: Net2Net's pattern does not hold.
    def feeds_add(lid: int) -> bool:
        (bn,) = graph.consumers[graph.layers[lid].output]
        return any(graph.layers[r].kind == ADD for r in graph.consumers[graph.layers[bn].output])

    conv = next(lid for lid, layer in enumerate(graph.layers) if layer.kind == CONV and feeds_add(lid))
    with pytest.raises(ValueError, match="lone BN then a lone ReLU"):
        wider(graph, weights, conv, 40, random.Random(0))
    with pytest.raises(ValueError, match="new_channels=8"):
        wider(graph, weights, 3, 8, random.Random(0))


def test_skip_add_keeps_function(parent) -> None:
    graph, weights = parent
    for target_hw in (32, 16):  # same size, then a 1x1 conv of stride 2
        to_node = _relu_nodes(graph, hw=target_hw)[-1]
        child, child_weights = skip(graph, weights, 3, to_node, random.Random(0), how="add")
        assert [layer.kind for layer in child.layers[-2:]] == [CONV, ADD]
        assert child.layers[-2].args[3] == 32 // target_hw
        _assert_preserved(graph, weights, child, child_weights)


def test_skip_concat_keeps_function(parent) -> None:
    graph, weights = parent
    inner = _relu_nodes(graph, hw=16)[0]  # a block's inner ReLU, read by one conv
    last = _relu_nodes(graph)[-1]  # read by global pooling -> Dense
    for to_node in (inner, last):
        child, child_weights = skip(graph, weights, 3, to_node, random.Random(0), how="concat")
        assert child.layers[-1].kind == "StubConcatenate"
        _assert_preserved(graph, weights, child, child_weights)


def test_skip_refusals(parent) -> None:
    graph, weights = parent
    later = _relu_nodes(graph, hw=16)[-1]
    with pytest.raises(ValueError, match="not an ancestor"):
        skip(graph, weights, later, 3, random.Random(0))
    with pytest.raises(ValueError, match="not the \\(H, W, C\\) output of a ReLU"):
        skip(graph, weights, 2, later, random.Random(0))
    # Two blocks in a stage: the first block's output is read by the second block's Add.
    two = resnet((8, 8, 3), 4, blocks=(2,), width=4, stem="small")
    block_out = next(n for n in _relu_nodes(two) if any(two.layers[r].kind == ADD for r in two.consumers[n]))
    with pytest.raises(ValueError, match="not a Conv or Dense"):
        skip(two, build_model(two).state_dict(), 3, block_out, random.Random(0), how="concat")
    with pytest.raises(ValueError, match="how="):
        skip(graph, weights, 3, later, random.Random(0), how="mul")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chain_of_random_morphs_keeps_function(parent, seed: int) -> None:
    graph, weights = parent
    rng = random.Random(seed)
    child, child_weights = graph, weights
    described = []
    for _ in range(5):
        child, child_weights, text = random_morph(child, child_weights, rng)
        described.append(text)
    assert all(text.split()[0] in ("deeper", "wider", "skip") for text in described), described
    _assert_preserved(graph, weights, child, child_weights)


def test_random_morph_covers_every_kind(parent) -> None:
    graph, weights = parent
    kinds = {
        random_morph(graph, weights, random.Random(seed))[2].split(" from")[0].split(" after")[0]
        for seed in range(40)
    }
    assert {"deeper", "skip add", "skip concat"} <= kinds and any(k.startswith("wider") for k in kinds)


def test_resnet50_seed_morphs_and_takes_the_tuned_kernel() -> None:
    seed = resnet()
    weights = build_model(seed).state_dict()
    child, _, _ = random_morph(seed, weights, random.Random(0))
    assert Graph.from_json(json.loads(json.dumps(child.to_json())), "child") == child
    # Two deeper morphs: the first conv lands at id 174, the second at 177 (AIPerf's count > 175).
    once, once_weights = deeper(seed, weights, 3, random.Random(0), kernel_size=3)
    twice, _ = deeper(once, once_weights, 3, random.Random(0), kernel_size=3)
    model = build_model(twice, kernel_size=5)
    assert model.layer_174.weight.shape[-1] == 3 and model.layer_177.weight.shape[-1] == 5
    assert model.layer_7.weight.shape[-1] == 3  # seed layers keep their kernel
