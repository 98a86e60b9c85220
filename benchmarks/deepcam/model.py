"""DeepLabv3+ with a modified aligned Xception backbone, as in the MLPerf HPC DeepCAM reference.

Layer for layer the reference's `architecture/deeplab_xception.py` (output stride 16 or 8, not
pretrained); `width_multiplier` and `middle_blocks` shrink it for the mini config.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mlhpc.benchmarks.deepcam.config import DeepCamConfig

NUM_CLASSES = 3  # background, tropical cyclone, atmospheric river
# The reference widths: entry flow, middle flow, exit flow, ASPP/decoder, low-level skip.
ENTRY_WIDTHS = (32, 64, 128, 256, 728)
EXIT_WIDTHS = (1024, 1536, 1536, 2048)
HEAD_WIDTH = 256
SKIP_WIDTH = 48
ASPP_RATES = {16: (1, 6, 12, 18), 8: (1, 12, 24, 36)}


def _scaled(width: int, multiplier: float) -> int:
    return max(1, math.ceil(width * multiplier))


class SeparableConv2d(nn.Module):
    """Depthwise k x k (atrous) conv then pointwise 1 x 1, 'same' padding for odd kernels."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            inplanes, inplanes, 3, stride, padding=dilation, dilation=dilation, groups=inplanes, bias=False
        )
        self.pointwise = nn.Conv2d(inplanes, planes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.conv1(x))


class Block(nn.Module):
    """Xception residual block: `reps` separable convs + BN (+ ReLU), a strided or trailing
    separable conv, and a 1 x 1 projection on the skip when the shape changes."""

    def __init__(
        self,
        inplanes: int,
        planes: int,
        reps: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        end_with_relu: bool = True,
        grow_first: bool = True,
        is_last: bool = False,
    ) -> None:
        super().__init__()
        self.end_with_relu = end_with_relu
        self.skip: nn.Module | None = None
        if planes != inplanes or stride != 1:
            self.skip = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers: list[nn.Module] = []
        widths = [inplanes] + ([planes] * reps if grow_first else [inplanes] * (reps - 1) + [planes])
        for cin, cout in itertools.pairwise(widths):
            layers += [SeparableConv2d(cin, cout, dilation=dilation), nn.BatchNorm2d(cout), nn.ReLU()]
        layers = layers[:-1]  # the reference drops the last ReLU of the stack
        if stride != 1:
            layers.append(SeparableConv2d(planes, planes, stride=2))
        elif is_last:
            layers.append(SeparableConv2d(planes, planes))
        self.rep = nn.Sequential(*layers)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.rep(inp) + (self.skip(inp) if self.skip is not None else inp)
        return F.relu(x) if self.end_with_relu else x


class Xception(nn.Module):
    """Entry flow (to stride 4 for the skip, then 8, then 16), `middle_blocks` 728-wide blocks,
    exit flow with atrous separable convs; returns (deep features, block1 low-level features)."""

    def __init__(self, in_channels: int, output_stride: int, width: float, middle_blocks: int) -> None:
        super().__init__()
        entry_stride, middle_rate, exit_rates = {16: (2, 1, (1, 2)), 8: (1, 2, (2, 4))}[output_stride]
        c32, c64, c128, c256, c728 = (_scaled(c, width) for c in ENTRY_WIDTHS)
        c1024, c1536a, c1536b, c2048 = (_scaled(c, width) for c in EXIT_WIDTHS)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, c32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(c32),
            nn.ReLU(),
            nn.Conv2d(c32, c64, 3, padding=1, bias=False),
            nn.BatchNorm2d(c64),
            nn.ReLU(),
        )
        self.block1 = Block(c64, c128, 2, stride=2, end_with_relu=False)
        self.entry = nn.Sequential(
            Block(c128, c256, 2, stride=2),
            Block(c256, c728, 2, stride=entry_stride, is_last=True),
        )
        self.middle = nn.Sequential(
            *(Block(c728, c728, 3, dilation=middle_rate) for _ in range(middle_blocks))
        )
        layers: list[nn.Module] = [
            Block(c728, c1024, 2, dilation=exit_rates[0], end_with_relu=False, grow_first=False, is_last=True)
        ]
        for cin, cout in ((c1024, c1536a), (c1536a, c1536b), (c1536b, c2048)):
            layers += [SeparableConv2d(cin, cout, dilation=exit_rates[1]), nn.BatchNorm2d(cout), nn.ReLU()]
        self.exit = nn.Sequential(*layers)
        self.out_channels = c2048
        self.low_level_channels = c128

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The reference applies this ReLU in place, so its decoder's skip input is post-ReLU too
        # (NVIDIA's submissions keep the skip pre-ReLU; the RCPs were made with the reference).
        low_level = F.relu(self.block1(self.stem(x)))
        x = self.exit(self.middle(self.entry(low_level)))
        return x, low_level


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1 x 1 conv, three atrous 3 x 3 convs and image pooling."""

    def __init__(self, inplanes: int, planes: int, rates: tuple[int, ...]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(
                    inplanes, planes, 1 if r == 1 else 3, padding=0 if r == 1 else r, dilation=r, bias=False
                ),
                nn.BatchNorm2d(planes),
                nn.ReLU(),
            )
            for r in rates
        )
        # The reference has no BN on the pooled branch (batch statistics of 1 x 1 maps), a
        # trainable per-channel affine instead.
        self.pool_conv = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.pool_scale = nn.Parameter(torch.ones(planes, 1, 1))
        self.pool_shift = nn.Parameter(torch.zeros(planes, 1, 1))
        self.project = nn.Sequential(
            nn.Conv2d((len(rates) + 1) * planes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pool_conv(F.adaptive_avg_pool2d(x, 1)) * self.pool_scale + self.pool_shift
        pooled = F.relu(pooled).expand(-1, -1, x.shape[2], x.shape[3])
        return self.project(torch.cat([branch(x) for branch in self.branches] + [pooled], dim=1))


def _deconv(cin: int, cout: int) -> nn.ConvTranspose2d:
    """Stride-2 transposed 3 x 3 conv that exactly doubles height and width."""
    return nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1, bias=False)


class Decoder(nn.Module):
    """The reference's deconvolution upsampler: x4 to the skip's stride (x2 at output stride 8),
    concat, two 3 x 3 convs and a 1 x 1, then two more x2 deconvolutions to the input size."""

    def __init__(self, width: int, skip_width: int, num_classes: int, output_stride: int) -> None:
        super().__init__()
        ups: list[nn.Module] = []
        for _ in range(int(math.log2(output_stride // 4))):
            ups += [_deconv(width, width), nn.BatchNorm2d(width), nn.ReLU()]
        self.up_to_skip = nn.Sequential(*ups)
        self.fuse = nn.Sequential(
            nn.Conv2d(width + skip_width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 1),
        )
        self.up_to_input = nn.Sequential(
            _deconv(width, width), nn.BatchNorm2d(width), nn.ReLU(), _deconv(width, num_classes)
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up_to_skip(x)
        return self.up_to_input(self.fuse(torch.cat((x, skip), dim=1)))


class DeepLabV3Plus(nn.Module):
    """(N, C, H, W) normalised fields -> (N, classes, H, W) logits; H and W multiples of the
    output stride (768 x 1152 and 96 x 144 are)."""

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int = NUM_CLASSES,
        output_stride: int = 16,
        width_multiplier: float = 1.0,
        middle_blocks: int = 16,
        loss_weights: tuple[float, ...] | None = None,
    ) -> None:
        super().__init__()
        # The loss's per-class weights travel with the model (a buffer moves with .to(device)):
        # the shared loop calls compute_loss(model, batch) without the config.
        weights = torch.ones(num_classes) if loss_weights is None else torch.tensor(loss_weights)
        self.register_buffer("loss_weights", weights.float(), persistent=False)
        if output_stride not in ASPP_RATES:
            raise ValueError(f"model.output_stride={output_stride} is not supported; use 16 or 8")
        self.output_stride = output_stride
        self.backbone = Xception(in_channels, output_stride, width_multiplier, middle_blocks)
        head = _scaled(HEAD_WIDTH, width_multiplier)
        skip = _scaled(SKIP_WIDTH, width_multiplier)
        self.aspp = ASPP(self.backbone.out_channels, head, ASPP_RATES[output_stride])
        self.skip = nn.Sequential(
            nn.Conv2d(self.backbone.low_level_channels, skip, 1, bias=False), nn.BatchNorm2d(skip), nn.ReLU()
        )
        self.decoder = Decoder(head, skip, num_classes, output_stride)
        # The reference initialises the backbone and the ASPP branches; the rest keeps torch's default.
        self.backbone.apply(_init)
        self.aspp.branches.apply(_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] % self.output_stride or x.shape[3] % self.output_stride:
            raise ValueError(
                f"input {tuple(x.shape[2:])} is not a multiple of the output stride {self.output_stride}"
            )
        features, low_level = self.backbone(x)
        return self.decoder(self.aspp(features), self.skip(low_level))


def _init(module: nn.Module) -> None:
    # The reference: Kaiming-normal convolutions, BN weight 1 and bias 0.
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.kaiming_normal_(module.weight)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def build_model(cfg: DeepCamConfig) -> DeepLabV3Plus:
    return DeepLabV3Plus(
        in_channels=cfg.data.num_channels,
        output_stride=cfg.model.output_stride,
        width_multiplier=cfg.model.width_multiplier,
        middle_blocks=cfg.model.middle_blocks,
        loss_weights=tuple(f**cfg.loss.weight_power for f in cfg.loss.class_frequencies),
    )
