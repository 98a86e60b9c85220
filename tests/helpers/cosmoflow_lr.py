"""CosmoFlow's LR per epoch in closed form, from the benchmark's own peak and multiplier: the
oracle the tests hold the dry run's stepped schedule and the reference runs' LRs against."""

from __future__ import annotations

from typing import Any

from mlhpc.benchmarks.cosmoflow.train import lr_multiplier, scaled_learning_rate


def learning_rate_per_epoch(cfg: Any) -> list[float]:
    """The LR at the first step of every epoch up to max_epochs; index 0 is epoch_num 1."""
    peak = scaled_learning_rate(cfg)
    return [peak * lr_multiplier(cfg, float(i)) for i in range(cfg.loop.max_epochs)]
