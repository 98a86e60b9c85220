"""The analytic level: layer-formula FLOPs against torch's FlopCounterMode, saved bytes against a
hand count, and each benchmark's on-disk sample size against the files its generator writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from mlhpc.characterize.analytic import Analytic, analyze, ring_allreduce_bytes
from mlhpc.characterize.layer_flops import FUNCTIONAL
from mlhpc.characterize.step_count import count_step
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError

NPY_HEADER_BYTES = 128
"""np.save's header for these arrays (format 1.0, padded to 64 bytes)."""
HDF5_OVERHEAD_BYTES = 8192
"""At most this much HDF5 metadata per file (superblock, object headers, chunk index): about 4.4 KiB
for a DeepCAM sample file and 5.2 KiB for an extreme weather year file when measured."""


def config(name: str, which: str) -> Any:
    bench = registry.get(name)
    return bench, load_config(bench.config_class, bench.config_path(which))


def grouped_excess(a: Analytic) -> int:
    """FlopCounterMode's overcount: it counts a grouped convolution's weight gradient as if ungrouped."""
    return sum((row.groups - 1) * row.backward_weight_flops for row in a.layers)


# ---------------------------------------------------------------- (a) the benchmarks
@pytest.mark.parametrize(
    ("name", "which", "device"),
    [
        ("cosmoflow", "mini", "meta"),
        ("cosmoflow", "full", "meta"),
        ("deepcam", "mini", "meta"),
        ("deepcam", "full", "meta"),
        ("extreme_weather", "mini", "cpu"),  # Faster R-CNN's NMS needs values
    ],
)
def test_layer_formulas_equal_flop_counter(name: str, which: str, device: str) -> None:
    bench, cfg = config(name, which)
    a = analyze(bench, cfg, device=device)
    assert a.device == device
    assert a.forward_flops_per_sample > 0
    assert a.forward_flops_per_sample == a.counter_forward_flops_per_sample
    assert a.counter_backward_flops_per_sample == a.backward_flops_per_sample + grouped_excess(a)
    assert a.counter_grouped_weight_grad_excess_flops_per_sample == grouped_excess(a)
    assert sum(row.forward_flops for row in a.layers) == a.forward_flops_per_sample
    # The first layer's input needs no gradient: its backward is the weight gradient alone.
    assert a.layers[0].backward_input_flops == 0 < a.layers[0].backward_weight_flops
    assert a.layers[1].backward_input_flops > 0
    json.dumps(dataclasses.asdict(a), allow_nan=False)  # plain numbers all through


def test_only_deepcam_has_grouped_convolutions_and_the_counter_overcounts_them() -> None:
    # The control for the excess term: DeepCAM's depthwise convolutions make it large.
    a = analyze(*config("deepcam", "mini"))
    assert any(row.groups > 1 for row in a.layers)
    assert a.counter_backward_flops_per_sample > a.backward_flops_per_sample + a.forward_flops_per_sample


def test_cosmoflow_on_cpu_counts_its_functional_convolutions_as_the_modules() -> None:
    # On a CPU CosmoFlow adds the bias after F.conv3d, bypassing Conv3d.__call__.
    bench, cfg = config("cosmoflow", "mini")
    on_cpu, on_meta = analyze(bench, cfg, device="cpu"), analyze(bench, cfg, device="meta")
    assert [row.name for row in on_cpu.layers] == [row.name for row in on_meta.layers]
    assert FUNCTIONAL not in {row.name for row in on_cpu.layers}
    assert on_cpu.forward_flops_per_sample == on_meta.forward_flops_per_sample
    assert on_cpu.backward_flops_per_sample == on_meta.backward_flops_per_sample
    assert on_cpu.counter_forward_flops_per_sample == on_cpu.forward_flops_per_sample


def test_a_model_with_data_dependent_shapes_is_refused_on_meta_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"meta device.*device='cpu'"):
        analyze(*config("extreme_weather", "mini"), device="meta")


# ---------------------------------------------------------------- (b) drawn layer stacks
@st.composite
def conv_stacks(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    """1-3 convolutions or transposed convolutions of one dimensionality (random groups, kernels,
    strides, dilations), then a linear layer, on the meta device."""
    dims = draw(st.integers(1, 3))
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
    transposed = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dims - 1]
    channels = in_channels = draw(st.sampled_from([1, 2, 4, 6]))
    size = length = draw(st.integers(4, 8 if dims < 3 else 5))
    layers: list[nn.Module] = []
    with torch.device("meta"):
        for _ in range(draw(st.integers(1, 3))):
            groups = draw(st.sampled_from([g for g in (1, 2, 3, 4) if channels % g == 0]))
            out = groups * draw(st.integers(1, 3))
            kernel, stride, dilation = (
                draw(st.integers(1, 3)),
                draw(st.integers(1, 2)),
                draw(st.integers(1, 2)),
            )
            padding = dilation * (kernel - 1) // 2
            shrunk = (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
            # A convolution that would leave no position becomes a transposed one (which grows).
            if draw(st.booleans()) or shrunk < 1:
                layers.append(transposed(channels, out, kernel, stride, padding, dilation=dilation, groups=groups))
                length = (length - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1
            else:
                layers.append(conv(channels, out, kernel, stride, padding, dilation=dilation, groups=groups))
                length = shrunk
            channels = out
        x = torch.empty(draw(st.integers(1, 3)), in_channels, *([size] * dims))
        features = nn.Sequential(*layers)(x).flatten(1).shape[1]
        model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(features, draw(st.integers(1, 5))))
    return model, x.requires_grad_(draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(conv_stacks())
def test_drawn_stacks_count_as_the_flop_counter_does(stack: tuple[nn.Module, torch.Tensor]) -> None:
    model, x = stack
    step = count_step(model, lambda m, batch: m(batch).square().mean(), x)
    assert step.forward_flops == step.counter_forward_flops
    assert step.counter_convention_backward_flops == step.counter_backward_flops
    assert len(step.calls) == len(model) - 1  # every layer but Flatten, once each
    assert (step.calls[0].input_grad_flops > 0) == x.requires_grad


def test_a_module_called_twice_counts_twice() -> None:
    layer = nn.Linear(3, 3, device="meta")
    model = nn.Sequential(layer, nn.ReLU(), layer)
    step = count_step(model, lambda m, x: m(x).sum(), torch.empty(5, 3, device="meta"))
    assert [c.name for c in step.calls] == ["0", "0"]  # one owner, the first name it has
    assert step.forward_flops == 2 * (2 * 5 * 3 * 3) == step.counter_forward_flops


# ---------------------------------------------------------------- (c) saved bytes by hand
@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("batch", [2, 4])
def test_saved_bytes_of_a_tiny_mlp_match_a_hand_count(device: str, batch: int) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to(device)
    step = count_step(model, lambda m, x: m(x).pow(2).sum(), torch.ones(batch, 4, device=device))
    # ReLU keeps its float32 result (3 a sample), which the second Linear saves again (one storage);
    # pow keeps its input (2 a sample); the weights are parameters and the input is the batch's.
    assert step.activation_bytes == batch * (3 + 2) * 4
    assert step.saved_input_bytes == batch * 4 * 4


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_saved_bytes_of_conv_norm_pool_match_a_hand_count(device: str) -> None:
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2)
    ).to(device)
    counts = [
        count_step(model, lambda m, x: m(x).sum(), torch.ones(b, 1, 4, 4, device=device)).activation_bytes
        for b in (2, 4)
    ]
    # A sample: the conv output BatchNorm keeps (2x4x4 float32), ReLU's result (the same again; max
    # pooling keeps that storage too) and the pool's int64 indices (2x2x2); per step, BatchNorm's
    # batch mean and inverse std (2 float32 each); its running statistics are buffers.
    per_sample, fixed = 32 * 4 + 32 * 4 + 8 * 8, 2 * 2 * 4
    assert counts == [2 * per_sample + fixed, 4 * per_sample + fixed]


# ---------------------------------------------------------------- (d) gradient bytes
def test_allreduce_bytes_are_the_gradient_bytes_of_a_real_step() -> None:
    bench, cfg = config("cosmoflow", "mini")
    a = analyze(bench, cfg)
    model = bench.build_model(cfg)
    bench.compute_loss(model, bench.example_batch(cfg, 2, torch.device("cpu"))).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert a.allreduce_bytes_per_step == sum(g.numel() * g.element_size() for g in grads) > 0
    assert ring_allreduce_bytes(a.allreduce_bytes_per_step, 4) == 1.5 * a.allreduce_bytes_per_step
    assert ring_allreduce_bytes(a.allreduce_bytes_per_step, 1) == 0


def test_traffic_terms_add_up_and_amortise_over_the_batch() -> None:
    bench, cfg = config("cosmoflow", "mini")
    small, large = analyze(bench, cfg, batch_size=1), analyze(bench, cfg, batch_size=64)
    terms = dataclasses.asdict(small.traffic)
    for not_a_term in ("micro_batch_size", "optimizer_batch_size", "total", "formula"):
        del terms[not_a_term]
    assert small.compulsory_traffic_bytes_per_sample == sum(terms.values())
    assert small.traffic.weight_read_forward == small.parameter_bytes
    assert large.traffic.weight_read_forward == small.parameter_bytes / 64
    assert small.traffic.optimizer_read == 2 * small.trainable_bytes + small.optimizer_state_bytes
    assert small.traffic.activation_write == small.activation_bytes_per_sample  # no batch norm here
    assert small.flop_per_memory_byte < large.flop_per_memory_byte
    assert small.input_bandwidth_per_pflops == small.sample_bytes * 1e15 / small.training_flops_per_sample


# ---------------------------------------------------------------- (e) bytes on disk
def test_cosmoflow_sample_bytes_are_its_two_npy_files(tmp_path: Path) -> None:
    bench, cfg = config("cosmoflow", "mini")
    bench.generate(cfg, tmp_path, num_samples=2)
    for data in sorted((tmp_path / "train").glob("*_data.npy")):
        label = data.with_name(data.name.replace("_data", "_label"))
        on_disk = data.stat().st_size + label.stat().st_size
        assert on_disk - bench.sample_bytes(cfg) == 2 * NPY_HEADER_BYTES


def test_deepcam_sample_bytes_are_its_hdf5_file(tmp_path: Path) -> None:
    bench, cfg = config("deepcam", "mini")
    bench.generate(cfg, tmp_path, num_samples=2)
    files = sorted((tmp_path / "train").glob("data-*.h5"))
    assert len(files) == 2
    for path in files:
        assert 0 < path.stat().st_size - bench.sample_bytes(cfg) <= HDF5_OVERHEAD_BYTES


def test_extreme_weather_sample_bytes_are_a_snapshot_of_its_year_file(tmp_path: Path) -> None:
    bench, cfg = config("extreme_weather", "mini")
    bench.generate(cfg, tmp_path, num_samples=3)  # three snapshots in one year file
    (year,) = (tmp_path / "train").glob("climo_*.h5")
    assert 0 < year.stat().st_size - 3 * bench.sample_bytes(cfg) <= HDF5_OVERHEAD_BYTES
