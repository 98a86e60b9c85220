"""mlhpc's AIPerf operation counter against AIPerf's profiler.py, run on the same graphs."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from mlhpc.benchmarks.aiperf.ops_count import KINDS, OpsPerImage, ops_per_image, ops_per_image_table
from tests.aiperf.aiperf_reference import RESNET50, reference_ops

# ResNet-50 seed at 224x224, per image (profiler.py's figures; the same for every kernel size,
# since the seed's 174 layers are all within the first 175).
RESNET50_EVAL = 7_806_583_495.0
RESNET50_TRAIN = 23_053_458_315.0


def resnet50() -> dict[str, Any]:
    return json.loads(RESNET50.read_text())


def extended_resnet50() -> dict[str, Any]:
    """ResNet-50 with layers appended past position 175, on its last 7x7x2048 map (node 172): a conv at
    position 175 (keeps its kernel), then convs past it (the tuned kernel, the graph's padding and
    stride), an Add of unequal shapes, an Add of equal ones, a Concatenate, a strided pooling, a
    dropout and a second Dense."""
    graph = resnet50()
    nodes, layers = graph["node_list"], graph["layer_list"]

    def node(shape: list[int]) -> int:
        nodes.append([len(nodes), shape])
        return len(nodes) - 1

    def layer(*spec: Any) -> None:
        layers.append([len(layers), list(spec)])

    a = node([7, 7, 64])
    layer("StubConv2d", 172, a, 2048, 64, 3, 1, 1)  # position 175: the graph's kernel 3
    b = node([7, 7, 64])
    layer("StubBatchNormalization2d", a, b, 64)
    c = node([7, 7, 64])
    layer("StubReLU", b, c)
    d = node([4, 4, 64])
    layer("StubConv2d", c, d, 64, 64, 1, 2, 0)  # tuned kernel, padding 0, stride 2
    e = node([7, 7, 64])
    layer("StubConv2d", c, e, 64, 64, 3, 1, 1)  # tuned kernel, padding 1
    f = node([7, 7, 64])
    layer("StubAdd", [a, d], f)  # unequal shapes: free
    g = node([7, 7, 64])
    layer("StubAdd", [a, e], g)
    h = node([7, 7, 128])
    layer("StubConcatenate", [f, g], h)
    i = node([4, 4, 128])
    layer("StubPooling2d", h, i, 3, 2, 1)
    j = node([4, 4, 128])
    layer("StubDropout2d", i, j, 0.5)
    k = node([128])
    layer("StubGlobalPooling2d", j, k)
    layer("StubDense", k, node([10]), 128, 10)
    return graph


def small_graph() -> dict[str, Any]:
    """A 16x16x3 network small enough to count by hand (see test_small_graph_by_hand)."""
    nodes = [[0, [16, 16, 3]], [1, [8, 8, 4]], [2, [8, 8, 4]], [3, [8, 8, 4]], [4, [3, 3, 4]],
             [5, [3, 3, 4]], [6, [3, 3, 4]], [7, [3, 3, 8]], [8, [8]], [9, [2]]]
    layers = [
        ["StubConv2d", 0, 1, 3, 4, 3, 2, 1],
        ["StubBatchNormalization2d", 1, 2, 4],
        ["StubReLU", 2, 3],
        ["StubPooling2d", 3, 4, 3, 2, 0],
        ["StubConv2d", 4, 5, 4, 4, 1, 1, 0],
        ["StubAdd", [4, 5], 6],
        ["StubAdd", [3, 6], 6],  # unequal shapes: not counted
        ["StubConcatenate", [5, 6], 7],
        ["StubGlobalPooling2d", 7, 8],
        ["StubDense", 8, 9, 8, 2],
    ]
    return {"node_list": nodes, "layer_list": [[index, spec] for index, spec in enumerate(layers)]}


CASES = {
    "resnet50-k3": (resnet50, 3),
    "resnet50-k5": (resnet50, 5),
    "resnet50-k7": (resnet50, 7),
    "extended-k3": (extended_resnet50, 3),
    "extended-k5": (extended_resnet50, 5),
    "extended-k7": (extended_resnet50, 7),
    "small-k5": (small_graph, 5),
}


@pytest.fixture(scope="module")
def profiler_figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[float, float]]:
    """profiler.py's (eval, train) per image of every case, from one subprocess."""
    names = list(CASES)
    figures = reference_ops([(CASES[n][0](), CASES[n][1]) for n in names], tmp_path_factory.mktemp("profiler"))
    return dict(zip(names, figures, strict=True))


@pytest.mark.parametrize("case", CASES)
def test_counter_equals_profiler(case: str, profiler_figures: dict[str, tuple[float, float]]) -> None:
    make, kernel_size = CASES[case]
    ours = ops_per_image(make(), kernel_size)
    assert (ours.eval, ours.train) == profiler_figures[case]


def test_resnet50_figures(profiler_figures: dict[str, tuple[float, float]]) -> None:
    for kernel_size in (3, 5, 7):
        assert ops_per_image(resnet50(), kernel_size) == OpsPerImage(RESNET50_EVAL, RESNET50_TRAIN)
        assert profiler_figures[f"resnet50-k{kernel_size}"] == (RESNET50_EVAL, RESNET50_TRAIN)
    print(f"\nResNet-50 224x224 per image: eval {RESNET50_EVAL:.0f}, train {RESNET50_TRAIN:.0f}")


def test_tuned_kernel_applies_past_position_175() -> None:
    assert len({ops_per_image(extended_resnet50(), k).eval for k in (3, 5, 7)}) == 3
    # Position 175 is a 3x3 conv of 2048 -> 64 on 7x7: always its graph kernel, whatever the tuned one.
    first_appended = 7 * 7 * 3 * 3 * 2048 * 64 * 2
    tables = {k: ops_per_image_table(extended_resnet50(), k) for k in (3, 5, 7)}
    for k, table in tables.items():
        # Tuned kernel k with the graph's padding: (7 + 0 - k) // 2 + 1 and (7 + 2 - k) // 1 + 1 = 10 - k.
        strided, same = (7 - k) // 2 + 1, 10 - k
        later = strided**2 * k * k * 64 * 64 * 2 + same**2 * k * k * 64 * 64 * 2
        assert table["conv"].eval == ops_per_image_table(resnet50(), 3)["conv"].eval + first_appended + later


def test_small_graph_by_hand() -> None:
    table = ops_per_image_table(small_graph(), 5)
    # conv 3x3/2 pad 1, 3 -> 4 on 16x16: out 8; first conv, so backward (2 out^2 + 2).
    conv1 = (8 * 8 * 9 * 3 * 4 * 2, 9 * 3 * 4 * (2 * 64 + 2))
    # conv 1x1, 4 -> 4 on 3x3: out 3; a later conv, backward (4 out^2 + 2).
    conv2 = (3 * 3 * 1 * 4 * 4 * 2, 1 * 4 * 4 * (4 * 9 + 2))
    assert (table["conv"].eval, table["conv"].train) == (conv1[0] + conv2[0], sum(conv1) + sum(conv2))
    assert (table["batch_norm"].eval, table["batch_norm"].train) == (7 * 8 * 8 * 4, 7 * 8 * 8 * 4 + 36.0)
    assert table["relu"].eval == 8 * 8 * 4
    assert table["max_pool"].eval == 8 * 8 * 4 * 3 * 3 / 2 / 2  # 576.0: the window count, not 3x3 outputs
    assert table["add"].eval == 3 * 3 * 4  # only the Add of equal shapes
    assert table["concatenate"] == OpsPerImage(0, 0)
    assert table["avg_pool"].eval == (3 * 3 - 1) * 8 + 8 * 4
    assert (table["dense"].eval, table["dense"].train) == (2 * 8 * 2, 2 * 8 * 2 + 4 * 8 * 2 + 2 * 9 * 2)
    assert table["softmax"] == OpsPerImage(2 * 8 + 1 + 2 * 4, 2 * 8 + 1 + 2 * 4)
    assert list(table) == list(KINDS)
    total = ops_per_image(small_graph(), 5)
    assert total.eval == sum(t.eval for t in table.values())
    assert total.train == sum(t.train for t in table.values())


def test_first_conv_alone_has_the_cheaper_backward() -> None:
    # Control: swap the two convs' order and the backward changes, so the first-conv rule is seen.
    graph = small_graph()
    swapped = copy.deepcopy(graph)
    swapped["layer_list"].insert(0, swapped["layer_list"].pop(4))
    assert ops_per_image(graph, 3).eval == ops_per_image(swapped, 3).eval
    assert ops_per_image(graph, 3).train != ops_per_image(swapped, 3).train


def test_relu_on_a_flat_node_is_an_error() -> None:
    graph = small_graph()
    graph["layer_list"].append([10, ["StubReLU", 9, 10]])
    graph["node_list"].append([10, [2]])
    with pytest.raises(ValueError, match=r"StubReLU .* node 9 has shape \[2\]"):
        ops_per_image(graph, 3)


def test_node_ids_must_be_positions() -> None:
    graph = small_graph()
    graph["node_list"][3][0] = 30
    with pytest.raises(ValueError, match="node_list entry 3 has id 30"):
        ops_per_image(graph, 3)


def test_a_kernel_that_leaves_no_output_is_an_error() -> None:
    with pytest.raises(ValueError, match="has no output"):
        ops_per_image(extended_resnet50(), 11)
