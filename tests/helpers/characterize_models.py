"""Small deterministic training steps for the characterize levels' tests: a two-convolution net on
random images, with SGD (momentum) or Adam, whose FLOPs and bytes are easy to write down by hand."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from mlhpc.characterize.workload import Workload

IMAGE = 16
"""Height and width of the images."""
IN_CHANNELS = 3
CHANNELS = 8
CLASSES = 10


def conv_net(*, groups: int = 1) -> nn.Sequential:
    """conv(3→8) → relu → conv(8→8, `groups`) → relu → flatten → linear(8·16·16 → 10)."""
    return nn.Sequential(
        nn.Conv2d(IN_CHANNELS, CHANNELS, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=groups),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(CHANNELS * IMAGE * IMAGE, CLASSES),
    )


def conv_workload(
    batch_size: int, *, optimizer: str = "sgd", device: str = "cpu", groups: int = 1, seed: int = 0
) -> Workload:
    """The net, its optimizer and cross-entropy on one fixed random batch, repeated."""
    torch.manual_seed(seed)
    model = conv_net(groups=groups).to(device)
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        raise ValueError(f"optimizer={optimizer!r}; known: sgd, adam")
    gen = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(batch_size, IN_CHANNELS, IMAGE, IMAGE, generator=gen).to(device)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=gen).to(device)
    return Workload(
        model=model,
        optimizer=opt,
        compute_loss=lambda m, batch: nn.functional.cross_entropy(m(batch[0]), batch[1]),
        batches=itertools.repeat((images, labels)),
        device=torch.device(device),
        batch_size=batch_size,
    )


def conv_forward_flops(batch_size: int, in_channels: int, out_channels: int) -> int:
    """2 x multiply-adds of a 3x3, stride-1, same-padded convolution on IMAGE x IMAGE (bias ignored,
    as torch's counter does)."""
    return 2 * batch_size * out_channels * IMAGE * IMAGE * in_channels * 9
