"""NVIDIA DALI, imported only when a config asks for it (the optional `gpu` extra): the import,
the loader choice, and the iterator every benchmark's DALI pipeline is read through."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mlhpc.common.errors import ConfigError, DataError

if TYPE_CHECKING:
    import torch


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


def data_builder(torch_data: Callable[..., Any], dali_data: Callable[..., Any]) -> Callable[..., Any]:
    """A benchmark's `build_data(cfg, data_dir, ctx, seed)`: `dali_data` where data.loader chooses
    DALI (`choose_loader`), else `torch_data`. The choice lives here, not in the benchmark's
    data.py, so that data.py never imports its dali.py (which reads the files through it)."""

    def build_data(cfg: Any, data_dir: Any, ctx: Any, seed: int) -> Any:
        if choose_loader(cfg.data.loader, ctx) == "dali":
            return dali_data(cfg, data_dir, ctx, seed)
        return torch_data(cfg, data_dir, ctx, seed)

    return build_data


class DaliLoader:
    """A DALI iterator seen as a DataLoader: a tuple of the `outputs` per batch, `len()` steps,
    one epoch per `iter()`."""

    def __init__(self, iterator: Any, *, outputs: tuple[str, ...], steps: int) -> None:
        self._iterator = iterator
        self._outputs = outputs
        self._steps = steps
        self._mid_epoch = False

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self._mid_epoch:
            # An abandoned epoch: finish it so the next one starts at its first sample.
            for _ in self._iterator:
                pass
        self._mid_epoch = True
        taken = 0
        # Run DALI's epoch to its end (auto_reset) even past `steps`, or its readers would start the
        # next epoch mid-shard: train shards may differ by a sample, and every rank stops after `steps`.
        for outputs in self._iterator:
            batch = tuple(outputs[0][name] for name in self._outputs)
            # DALI pads a shard shorter than the longest with empty batches to keep ranks in step.
            if taken < self._steps and batch[0].shape[0] > 0:
                taken += 1
                yield batch
        self._mid_epoch = False


def dali_iterator(
    dali: ModuleType, pipe: Any, outputs: tuple[str, ...], *, what: str, reader_name: str | None = None
) -> Any:
    """DALI's torch iterator over `pipe` (built here), resetting itself after each epoch and
    keeping a last partial batch (DaliLoader drops what a rank must not see); a pipeline that
    cannot read `what` is one DataError naming DALI's cause."""
    try:
        pipe.build()
        return dali.plugin.pytorch.DALIGenericIterator(
            pipe,
            list(outputs),
            reader_name=reader_name,
            auto_reset=True,
            # PARTIAL for train too: with DROP and unequal shards the readers of the longer shards
            # carry a sample into the next epoch, and ranks then see duplicates. DaliLoader drops instead.
            last_batch_policy=dali.plugin.pytorch.LastBatchPolicy.PARTIAL,
        )
    except RuntimeError as e:
        raise DataError(
            f"DALI cannot read {what} ({_reason(e)}); regenerate or restage it, or use data.loader=torch"
        ) from e


def _reason(error: RuntimeError) -> str:
    """The line of a DALI error that names the cause; the rest is its own traceback and context."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "encountered:" in lines:
        after = lines[lines.index("encountered:") + 1 :]
        if after:
            return after[0]
    return lines[-1] if lines else type(error).__name__
