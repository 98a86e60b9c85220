"""AIPerf graphs: the seed equals AIPerf's resnet50.json, NNI JSON round-trips, hostile JSON is a
DataError, and GraphNet computes the shapes the graph says."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.aiperf.graph import CONV, Graph, parameter_count
from mlhpc.benchmarks.aiperf.net import build_model
from mlhpc.benchmarks.aiperf.seed import resnet
from mlhpc.common.errors import DataError

SEED_JSON = Path(__file__).parents[1] / "data" / "aiperf" / "resnet50.json"


def _aiperf_seed() -> dict:
    return json.loads(SEED_JSON.read_text())


def _mini() -> Graph:
    return resnet((32, 32, 3), 10, blocks=(1, 1, 1, 1), width=8, stem="small")


def _json_round(value: object) -> object:
    return json.loads(json.dumps(value))


def test_resnet50_seed_is_aiperfs_file() -> None:
    assert resnet() == Graph.from_json(_aiperf_seed(), str(SEED_JSON))
    assert _json_round(resnet().to_json()) == _aiperf_seed()


def test_aiperf_file_round_trips() -> None:
    data = _aiperf_seed()
    graph = Graph.from_json(data, str(SEED_JSON))
    assert _json_round(graph.to_json()) == data
    assert len(graph.layers) == 174 and graph.output_node == 174
    assert Graph.from_json(_json_round(_mini().to_json()), "mini") == _mini()


def test_topological_order_runs_layers_after_their_inputs() -> None:
    graph = resnet()
    done = {0}
    for lid in graph.topological_order():
        assert set(graph.layers[lid].inputs) <= done
        done.add(graph.layers[lid].output)
    assert len(done) == len(graph.nodes)


def test_resnet50_parameters_are_torchvisions_plus_conv_biases() -> None:
    graph = resnet()
    model = build_model(graph)
    count = sum(p.numel() for p in model.parameters())
    conv_biases = sum(layer.args[1] for layer in graph.layers if layer.kind == CONV)
    assert count == parameter_count(graph) == 25_557_032 + conv_biases  # torchvision resnet50: 25,557,032


def _assert_graph_shapes(graph: Graph, batch: int = 2) -> torch.Tensor:
    """Run the model and check every layer's output against the graph's channels-last shape."""
    model = build_model(graph).eval()
    seen: dict[int, tuple[int, ...]] = {}
    for lid in range(len(graph.layers)):
        module = getattr(model, f"layer_{lid}")
        module.register_forward_hook(lambda _m, _i, out, lid=lid: seen.__setitem__(lid, tuple(out.shape)))
    h, w, c = graph.input_shape
    out = model(torch.randn(batch, c, h, w))
    for lid, layer in enumerate(graph.layers):
        shape = graph.nodes[layer.output]
        nchw = (batch, shape[2], shape[0], shape[1]) if len(shape) == 3 else (batch, *shape)
        assert seen[lid] == nchw, f"layer {lid} {layer}"
    return out


def test_mini_seed_runs_with_graph_shapes() -> None:
    out = _assert_graph_shapes(_mini())
    assert out.shape == (2, 10)


def test_odd_sizes_keep_graph_shapes() -> None:
    # 33 -> conv 7/2 -> 17 -> max pool 3/2 -> NNI's int(17 / 2) = 8, where Keras "same" gives 9.
    out = _assert_graph_shapes(resnet((33, 33, 3), 5, blocks=(1, 1), width=4))
    assert out.shape == (2, 5)


def test_dropout_only_in_training() -> None:
    graph = _mini()
    plain, dropped = build_model(graph).eval(), build_model(graph, dropout=0.9).eval()
    dropped.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(dropped(x), plain(x))
    assert not torch.allclose(dropped.train()(x), plain.train()(x))


def test_bad_model_options_are_refused() -> None:
    with pytest.raises(ValueError, match="kernel_size=4"):
        build_model(_mini(), kernel_size=4)
    with pytest.raises(ValueError, match=r"dropout=1\.0"):
        build_model(_mini(), dropout=1.0)


# --- hostile JSON ---------------------------------------------------------------------------------


def _load(data: object) -> Graph:
    try:
        return Graph.from_json(data, "runs/arch/7/model.json")
    except DataError as e:
        message = str(e)
        assert "\n" not in message and message.startswith("runs/arch/7/model.json: "), message
        raise


def _layer(data: dict, lid: int) -> list:
    return data["layer_list"][lid][1]


def _last_3x3(data: dict) -> int:
    return max(lid for lid, layer in data["layer_list"] if layer[0] == CONV and layer[5] == 3)


def _mutate(fn):
    data = _mini().to_json()
    fn(data)
    return _json_round(data)


NAMED_CASES = {
    "not an object": (None, "the graph is a JSON list; expected an object"),
    "missing layer_list": (lambda d: d.pop("layer_list"), "layer_list' is missing"),
    "unknown key": (lambda d: d.update(extra=1), "unknown key 'extra'"),
    "bool as node id": (lambda d: _layer(d, 4).__setitem__(1, True), "layer 4 input is True"),
    "float channels": (lambda d: _layer(d, 0).__setitem__(4, 8.0), "layer 0 out_channels is 8.0"),
    "huge stride": (lambda d: _layer(d, 0).__setitem__(6, 10**30), "stride is 1000000000000"),
    "node out of range": (lambda d: _layer(d, 3).__setitem__(1, 999), "layer 3 input is 999"),
    "unknown kind": (lambda d: _layer(d, 2).__setitem__(0, "StubSoftmax"), "kind 'StubSoftmax'"),
    "too few args": (lambda d: _layer(d, 0).pop(), "has 4 arguments; expected 5"),
    "self loop": (lambda d: _layer(d, 3).__setitem__(1, 4), "cycle"),
    "cycle": (lambda d: _layer(d, 3).__setitem__(1, 10), "cycle"),
    "two writers": (lambda d: _layer(d, 2).__setitem__(2, 2), "written by layers 1 and 2"),
    "wrong in_channels": (lambda d: _layer(d, 3).__setitem__(3, 9), "in_channels=9"),
    "wrong node shape": (lambda d: d["node_list"][5][1].__setitem__(2, 99), "node_list says node 5"),
    "add shape mismatch": (lambda d: _layer(d, 13).__setitem__(1, [13, 3]), "Add inputs differ"),
    "add reads a node twice": (lambda d: _layer(d, 13).__setitem__(1, [13, 13]), "twice"),
    "dense units": (lambda d: _layer(d, 52).__setitem__(3, 7), "in_units=7"),
    "dense on a map": (lambda d: _layer(d, 52).__setitem__(1, 51), "1-D input"),
    "node id mismatch": (lambda d: d["node_list"][3].__setitem__(0, 4), r"node_list\[3\] id is 4"),
    "bookkeeping type": (lambda d: d.__setitem__("adj_list", []), "adj_list is a list"),
    "too many layers": (lambda d: d.__setitem__("layer_list", [[0, []]] * 10_001), "10001 items"),
    "kernel over input": (lambda d: _layer(d, _last_3x3(d)).__setitem__(5, 31), "larger than its 4x4 input"),
}


@pytest.mark.parametrize("name", sorted(NAMED_CASES))
def test_named_hostile_graphs(name: str) -> None:
    mutate, match = NAMED_CASES[name]
    data = [] if name == "not an object" else _mutate(mutate)
    with pytest.raises(DataError, match=match):
        _load(data)


def test_dangling_branch_is_two_outputs() -> None:
    data = _mini().to_json()
    data["layer_list"].append([53, ["StubReLU", 3, 54]])
    data["node_list"].append([54, [32, 32, 8]])
    with pytest.raises(DataError, match="2 nodes are read by no layer"):
        _load(_json_round(data))


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


_BASE = _json_round(_mini().to_json())
_PATHS = _paths(_BASE)[1:]
_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.integers(min_value=-2, max_value=60),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(min_value=-1, max_value=60), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_PATHS) - 1), st.sampled_from(["delete", "replace", "wrap"]), _JUNK),
        min_size=1,
        max_size=3,
    )
)
def test_mutated_json_is_a_data_error_or_valid(edits: list) -> None:
    data = copy.deepcopy(_BASE)
    for index, action, junk in edits:
        path = _PATHS[index]
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            current = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = junk
        else:
            parent[path[-1]] = [current]
    try:
        graph = _load(data)
    except DataError:
        return
    # A harmless edit (bookkeeping, vis): the graph is whole and round-trips.
    assert Graph.from_json(_json_round(graph.to_json()), "again") == graph
