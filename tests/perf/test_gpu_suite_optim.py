"""The optimizers' multi-tensor (`_foreach_*`) paths, checked against their per-tensor paths on the
CPU: CosmoFlow's VelocitySGD (ours: the same bits, so on everywhere) and DeepCAM's timm LAMB
(timm's: rounds differently, so on CUDA only, timm's default)."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.cosmoflow.train import VelocitySGD
from mlhpc.benchmarks.deepcam.train import lamb_multi_tensor

timm_optim = pytest.importorskip("timm.optim")


def small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
    )


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(4, 3, 12, 12, generator=generator)).square().mean().backward()
        optimizer.step()


def groups(model: torch.nn.Module, decay: float) -> list[dict]:
    """Decay on the convolutions' weights only, and one parameter left without a gradient."""
    params = list(model.parameters())
    params[-1].requires_grad_(False)  # its grad stays None: both paths must skip it
    return [
        {"params": [p for p in params if p.dim() == 4], "weight_decay": decay},
        {"params": [p for p in params if p.dim() != 4], "weight_decay": 0.0},
    ]


@settings(max_examples=20, deadline=None)
@given(
    lr=st.floats(1e-4, 1.0),
    momentum=st.floats(0.0, 0.99),
    decay=st.sampled_from([0.0, 1e-4, 0.05]),
    seed=st.integers(0, 2**16),
)
def test_velocity_sgd_multi_tensor_is_the_per_tensor_update_bit_for_bit(
    lr: float, momentum: float, decay: float, seed: int
) -> None:
    models = [small_model(seed), small_model(seed)]
    optimizers = [
        VelocitySGD(groups(model, decay), lr=lr, momentum=momentum, foreach=foreach)
        for model, foreach in zip(models, (False, True), strict=True)
    ]
    for model, optimizer in zip(models, optimizers, strict=True):
        train(model, optimizer, steps=4, seed=seed)
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    velocities = [[s["momentum_buffer"] for s in opt.state.values()] for opt in optimizers]
    assert len(velocities[0]) == len(velocities[1]) == 5  # the gradient-less parameter has none
    assert all(torch.equal(a, b) for a, b in zip(*velocities, strict=True))


def test_velocity_sgd_moves_the_parameters_as_written() -> None:
    """v = m v + lr (g + wd w); p -= v, by hand for two steps (a control that the paths are right,
    not only equal)."""
    for foreach in (False, True):
        w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        optimizer = VelocitySGD([{"params": [w], "weight_decay": 0.5}], lr=0.1, momentum=0.9, foreach=foreach)
        expected, velocity = w.detach().clone(), torch.zeros(2)
        for _ in range(2):
            w.grad = torch.tensor([0.3, 0.4])
            velocity = 0.9 * velocity + 0.1 * (w.grad + 0.5 * expected)
            expected = expected - velocity
            optimizer.step()
        assert torch.allclose(w.detach(), expected, atol=1e-7)


@pytest.mark.skipif(
    "foreach" not in inspect.signature(timm_optim.Lamb.__init__).parameters,
    reason="this timm's Lamb has no multi-tensor path (DeepCAM then steps per tensor)",
)
def test_lamb_multi_tensor_equals_per_tensor_to_rounding() -> None:
    """timm's multi-tensor LAMB against its per-tensor one: the same step to float rounding (not
    the same bits, hence on CUDA only), and DeepCAM's optimizer asks timm for its default."""
    assert lamb_multi_tensor(timm_optim.Lamb) == {"foreach": None}
    models = [small_model(0), small_model(0)]
    optimizers = [
        timm_optim.Lamb(model.parameters(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0, foreach=foreach)
        for model, foreach in zip(models, (False, True), strict=True)
    ]
    for model, optimizer in zip(models, optimizers, strict=True):
        train(model, optimizer, steps=1, seed=0)
    before = small_model(0).state_dict()
    for key, a in models[0].state_dict().items():
        b = models[1].state_dict()[key]
        moved = (a.float() - before[key].float()).abs().max()
        assert torch.allclose(a, b, rtol=0, atol=1e-6 * max(moved.item(), 1e-3)), key


def test_lamb_without_a_multi_tensor_path_gets_no_foreach_argument() -> None:
    class OldLamb:
        def __init__(self, params: object, lr: float = 1e-3) -> None: ...

    assert lamb_multi_tensor(OldLamb) == {}
