"""NVIDIA DALI, imported only when a config asks for it (the optional `gpu` extra)."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

from mlhpc.common.errors import ConfigError


def import_dali() -> ModuleType:
    """nvidia.dali with `dali.math` and `dali.plugin.pytorch` bound; ConfigError without the extra."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.math
        import nvidia.dali.plugin.pytorch  # noqa: F401  (binds dali.plugin.pytorch)
    except ImportError as e:
        raise ConfigError(
            "data.loader=dali needs nvidia-dali: pip install 'mlhpc[gpu]', or use data.loader=torch"
        ) from e
    return dali


def device_id(ctx: Any) -> int | None:
    """The pipeline's device: this rank's GPU, or None for a CPU-only pipeline (DALI refuses a GPU
    one where CUDA is missing)."""
    if ctx.device.type != "cuda":
        return None
    import torch

    return ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()


def choose_loader(requested: str, ctx: Any) -> str:
    """data.loader as configured; auto is DALI on a GPU when DALI is installed, else torch's
    DataLoader (which always works)."""
    if requested != "auto":
        return requested
    on_gpu = ctx.device.type == "cuda"
    return "dali" if on_gpu and importlib.util.find_spec("nvidia.dali") is not None else "torch"
