"""CosmoFlow's faster CPU path (channels_last_3d, the bias added after oneDNN's convolution, the
activations in place) computes what the plain path does: outputs, gradients and a few SGD steps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.cosmoflow import model as cosmo

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def plain_forward(net: cosmo.CosmoFlowNet, x: torch.Tensor) -> torch.Tensor:
    """The forward pass as it was before the CPU path: each layer as a module, out of place."""
    for layer in net.convs:
        x = layer(x)
        if isinstance(layer, torch.nn.Conv3d):
            x = F.leaky_relu(x, cosmo.LEAKY_SLOPE)
    x = x.flatten(1)
    for layer in net.dense:
        x = net.dropout(F.leaky_relu(layer(x), cosmo.LEAKY_SLOPE))
    return torch.tanh(net.output(x)) * cosmo.OUTPUT_SCALE


def _pair(seed: int, size: int, filters: int) -> tuple[cosmo.CosmoFlowNet, cosmo.CosmoFlowNet]:
    torch.manual_seed(seed)
    kwargs = dict(in_channels=4, sample_size=size, conv_layers=3, base_filters=filters, kernel_size=3)
    plain = cosmo.CosmoFlowNet(**kwargs, dense_units=(32, 16), dropout=0.0)
    fast = cosmo.CosmoFlowNet(**kwargs, dense_units=(32, 16), dropout=0.0)
    fast.load_state_dict(plain.state_dict())
    return plain, fast.to(memory_format=torch.channels_last_3d)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    size=st.sampled_from([6, 8, 12, 16]),
    filters=st.sampled_from([4, 8]),
    batch=st.integers(1, 4),
)
def test_fast_path_equals_the_plain_path(seed: int, size: int, filters: int, batch: int) -> None:
    plain, fast = _pair(seed, size, filters)
    generator = torch.Generator().manual_seed(seed)
    cubes = torch.rand(batch, 4, size, size, size, generator=generator) * 3
    targets = torch.rand(batch, 4, generator=generator) * 2 - 1
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) for net in (plain, fast)]
    for _ in range(3):  # outputs, gradients and the parameters they move, step after step
        expected = plain_forward(plain, cubes)
        got = fast(cubes.contiguous(memory_format=torch.channels_last_3d))
        torch.testing.assert_close(got, expected, **TOLERANCE)
        for out, optimizer in zip((expected, got), optimizers, strict=True):
            optimizer.zero_grad()
            F.mse_loss(out, targets).backward()
        for (name, p), q in zip(plain.named_parameters(), fast.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, **TOLERANCE, msg=f"gradient of {name}")
        for optimizer in optimizers:
            optimizer.step()


def test_the_bias_goes_after_the_convolution_on_a_cpu_only_when_unset() -> None:
    _, net = _pair(0, 8, 4)
    convs = [layer for layer in net.convs if isinstance(layer, torch.nn.Conv3d)]
    called: list[torch.nn.Module] = []
    for conv in convs:
        conv.register_forward_hook(lambda module, *_: called.append(module))
    cube = torch.rand(2, 4, 8, 8, 8)
    net(cube)
    assert called == []  # unset on a CPU: F.conv3d without the bias, then the bias added
    net.bias_after_convolution = False
    net(cube)
    assert called == convs  # the modules themselves, bias inside, as on a GPU
    assert all(conv.bias is not None for conv in convs)  # same parameters, same checkpoint keys
