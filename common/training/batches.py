"""A batch on its way to the model: moved to the device in the model's memory format, and counted."""

from __future__ import annotations

from typing import Any

import torch

MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}
_INPUT_DIMS = {"channels_last": 4, "channels_last_3d": 5}
"""The tensors a memory format applies to: NCHW batches for channels_last, NCDHW for _3d."""


def to_device(batch: Any, device: torch.device, memory_format: str = "contiguous") -> Any:
    """Move tensors inside lists, tuples and dicts to `device`; the model's inputs (4D or 5D for the
    channels-last formats) in `memory_format`."""
    if torch.is_tensor(batch):
        batch = batch.to(device, non_blocking=True)
        if batch.dim() == _INPUT_DIMS.get(memory_format):
            batch = batch.contiguous(memory_format=MEMORY_FORMATS[memory_format])
        return batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, memory_format) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, memory_format) for k, v in batch.items()}
    return batch


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor, or the length of its first list."""
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if torch.is_tensor(first) else len(first)
