"""The CosmoFlow 3D CNN of the MLPerf HPC reference, adapting to the cube size."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig

NUM_TARGETS = 4
LEAKY_SLOPE = 0.3  # the reference's LeakyReLU alpha
OUTPUT_SCALE = 1.2  # tanh output scaled to cover targets in [-1, 1] with margin


class CosmoFlowNet(nn.Module):
    """conv(k, same) + LeakyReLU + maxpool(2) blocks with 32*2^i filters, then FC 128 -> 64 -> 4."""

    def __init__(
        self,
        *,
        in_channels: int,
        sample_size: int,
        conv_layers: int,
        base_filters: int,
        kernel_size: int,
        dense_units: tuple[int, ...],
        dropout: float,
    ) -> None:
        super().__init__()
        blocks = []
        channels, size = in_channels, sample_size
        for i in range(conv_layers):
            out = base_filters * 2**i
            blocks.append(nn.Conv3d(channels, out, kernel_size, padding="same"))
            channels = out
            # Small cubes stop pooling at 1 voxel instead of failing: the model adapts to the size.
            blocks.append(nn.MaxPool3d(2) if size >= 2 else nn.Identity())
            size = max(1, size // 2)
        self.convs = nn.ModuleList(blocks)
        dense = []
        width = channels * size**3
        for units in dense_units:
            dense.append(nn.Linear(width, units))
            width = units
        self.dense = nn.ModuleList(dense)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.output = nn.Linear(width, NUM_TARGETS)
        self.apply(_glorot_init)

    bias_after_convolution: bool | None = None
    """Add each convolution's bias in a pass of its own (True) or inside the convolution (False);
    None: after it on a CPU, inside it elsewhere. With the bias inside, oneDNN's backward-weights
    pass of the first layer took 3.6 s at batch 4 on one thread, against 1.2 s in TensorFlow, which
    computes the bias gradient on its own (perf/RESULTS.md, 2026-11-29); cuDNN fuses it for free."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias_after = self.bias_after_convolution
        if bias_after is None:
            bias_after = x.device.type == "cpu"
        for layer in self.convs:
            if isinstance(layer, nn.Conv3d):
                x = _convolve(layer, x, bias_after)
                # In place: the convolution's backward does not need its output, and
                # leaky_relu's backward reads the sign off its result (the slope is positive).
                x = F.leaky_relu_(x, LEAKY_SLOPE)
            else:
                x = layer(x)
        x = x.flatten(1)
        for layer in self.dense:
            x = self.dropout(F.leaky_relu(layer(x), LEAKY_SLOPE))
        return torch.tanh(self.output(x)) * OUTPUT_SCALE


def _convolve(conv: nn.Conv3d, x: torch.Tensor, bias_after: bool) -> torch.Tensor:
    if not bias_after or conv.bias is None:
        return conv(x)
    out = F.conv3d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
    return out.add_(conv.bias.view(1, -1, 1, 1, 1))


def _glorot_init(module: nn.Module) -> None:
    # The reference (Keras) initializes with Glorot-uniform weights and zero biases; torch's
    # default leaves this un-normalized net stuck on a plateau for many epochs.
    if isinstance(module, (nn.Conv3d, nn.Linear)):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def build_model(cfg: CosmoFlowConfig) -> CosmoFlowNet:
    return CosmoFlowNet(
        in_channels=cfg.data.num_channels,
        sample_size=cfg.data.sample_size,
        conv_layers=cfg.model.conv_layers,
        base_filters=cfg.model.base_filters,
        kernel_size=cfg.model.kernel_size,
        dense_units=cfg.model.dense_units,
        dropout=cfg.model.dropout,
    )
