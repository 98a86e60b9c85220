"""Training FLOPs from layer formulas: every convolution and linear call of a step, counted from its
shapes as it runs. A torch-function mode sees each call, so a module called twice counts twice and
a module's weight used through a functional call (CosmoFlow's bias-after path) still counts as it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_CONVOLUTIONS = (F.conv1d, F.conv2d, F.conv3d)
_TRANSPOSED = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
FUNCTIONAL = "<functional>"
"""The layer name of a call whose weight is not one of the model's parameters."""


@dataclass(frozen=True)
class LayerCall:
    """One call of a convolution or linear layer, its FLOPs counting a multiply-add as 2."""

    name: str
    """The module that owns the weight (its qualified name in the model), or FUNCTIONAL."""
    kind: str
    """conv, conv_transpose or linear."""
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    groups: int
    forward_flops: int
    weight_grad_flops: int
    """The weight gradient's FLOPs; 0 when the weight does not train or grad mode is off."""
    input_grad_flops: int
    """The input gradient's FLOPs; 0 when the input does not require grad (the first layer)."""

    @property
    def counter_weight_grad_flops(self) -> int:
        """What torch.utils.flop_counter (2.14) counts for the weight gradient: it ignores groups,
        so a grouped convolution's weight gradient counts `groups` times its multiply-adds."""
        return self.weight_grad_flops * self.groups


def layer_call(name: str, kind: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> LayerCall:
    """The formula for one call. A convolution's multiply-adds are batch x output positions x the
    weight's elements (C_out x C_in/groups x kernel: groups are in the weight's shape); a transposed
    one's the same over input positions; a linear layer's, rows x in x out. Stride, padding and
    dilation act through the output's shape. Each gradient costs as many as the forward."""
    if kind == "linear":
        macs = math.prod(x.shape[:-1]) * weight.numel()
        groups = 1
    else:
        batched = x.dim() == weight.dim()  # else an unbatched (C, *spatial) input
        batch = x.shape[0] if batched else 1
        positions = (out if kind == "conv" else x).shape[2 if batched else 1 :]
        macs = batch * math.prod(positions) * weight.numel()
        channels = (x if kind == "conv" else out).shape[1 if batched else 0]
        groups = channels // weight.shape[1]
    grad = torch.is_grad_enabled()
    return LayerCall(
        name=name,
        kind=kind,
        input_shape=tuple(x.shape),
        weight_shape=tuple(weight.shape),
        output_shape=tuple(out.shape),
        groups=groups,
        forward_flops=2 * macs,
        weight_grad_flops=2 * macs if grad and weight.requires_grad else 0,
        input_grad_flops=2 * macs if grad and x.requires_grad else 0,
    )


class LayerFlopMode(TorchFunctionMode):
    """Records a LayerCall for every conv*, conv_transpose* and linear call made while active."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.calls: list[LayerCall] = []
        self._owners = {
            id(p): module_name
            for module_name, module in model.named_modules()
            for p in module.parameters(recurse=False)
        }

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = _kind(func)
        if kind is not None:
            x = args[0] if args else kwargs["input"]
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            name = self._owners.get(id(weight), FUNCTIONAL)
            self.calls.append(layer_call(name, kind, x, weight, out))
        return out


def _kind(func: Callable[..., Any]) -> str | None:
    # By identity: the mode also sees Tensor methods and descriptors, some with odd __eq__.
    if any(func is f for f in _CONVOLUTIONS):
        return "conv"
    if any(func is f for f in _TRANSPOSED):
        return "conv_transpose"
    if func is F.linear:
        return "linear"
    return None
