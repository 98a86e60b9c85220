"""One training step counted from shapes: layer-formula FLOPs, FlopCounterMode's FLOPs over the
forward and over the backward, and the bytes autograd saves for the backward."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import FlopCounterMode

from mlhpc.characterize.layer_flops import LayerCall, LayerFlopMode
from mlhpc.common.training.batches import batch_size


@dataclass(frozen=True)
class StepCount:
    """What one forward and backward at one batch size does, counted on any device."""

    batch_size: int
    calls: tuple[LayerCall, ...]
    counter_forward_flops: int
    """torch.utils.flop_counter.FlopCounterMode over the forward (loss included)."""
    counter_backward_flops: int
    """FlopCounterMode over loss.backward()."""
    activation_bytes: int
    """Bytes autograd saves for the backward, excluding parameters, buffers and the batch: each
    saved tensor's whole storage, once per storage (views and a tensor saved by two operations
    share one). Keyed by storage identity (torch's StorageWeakRef): not data_ptr, 0 for every
    tensor on the meta device, nor id(tensor), which counts a view or an alias twice."""
    activation_float_values: int
    """Floating-point values among the saved bytes (integer indices and masks aside): what the
    activations take at another precision (the 16-bit count a published figure uses)."""
    saved_input_bytes: int
    """Bytes of the batch's own tensors that autograd saves (the first layer's input)."""
    input_bytes: int
    """Bytes of every tensor in the batch (fields and labels)."""
    model_input_values: int
    """Values of the batch's first tensor, the model's input (fields, not labels)."""

    @property
    def forward_flops(self) -> int:
        return sum(c.forward_flops for c in self.calls)

    @property
    def backward_weight_flops(self) -> int:
        return sum(c.weight_grad_flops for c in self.calls)

    @property
    def backward_input_flops(self) -> int:
        return sum(c.input_grad_flops for c in self.calls)

    @property
    def counter_convention_backward_flops(self) -> int:
        """The layer formulas' backward as FlopCounterMode counts it (groups ignored in the
        weight gradient): equal to counter_backward_flops when every layer is counted."""
        return sum(c.counter_weight_grad_flops + c.input_grad_flops for c in self.calls)


def count_step(
    model: torch.nn.Module, compute_loss: Callable[[torch.nn.Module, Any], torch.Tensor], batch: Any
) -> StepCount:
    """One forward (layer formulas, FlopCounterMode and the saved-tensor hooks all watching) and
    one backward (a second FlopCounterMode), on whatever device model and batch are."""
    state = {_storage_key(t) for t in (*model.parameters(), *model.buffers())}
    inputs = {_storage_key(t) for t in _tensors(batch)}
    saved: dict[Any, int] = {}
    saved_floats: dict[Any, int] = {}
    saved_inputs: dict[Any, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key in inputs:
            saved_inputs[key] = _storage_bytes(tensor)
        elif key not in state:
            saved[key] = _storage_bytes(tensor)
            if tensor.dtype.is_floating_point:
                saved_floats[key] = saved[key] // tensor.element_size()
        return tensor

    layers = LayerFlopMode(model)
    forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), layers:
        loss = compute_loss(model, batch)
    with backward:
        loss.backward()
    return StepCount(
        batch_size=batch_size(batch),
        calls=tuple(layers.calls),
        counter_forward_flops=forward.get_total_flops(),
        counter_backward_flops=backward.get_total_flops(),
        activation_bytes=sum(saved.values()),
        activation_float_values=sum(saved_floats.values()),
        saved_input_bytes=sum(saved_inputs.values()),
        input_bytes=sum(t.numel() * t.element_size() for t in _tensors(batch)),
        model_input_values=next(_tensors(batch)).numel(),
    )


def _storage_key(tensor: torch.Tensor) -> Any:
    try:
        return StorageWeakRef(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own (sparse)
        return id(tensor)


def _storage_bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return tensor.numel() * tensor.element_size()


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if torch.is_tensor(batch):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)
