"""Benchmarks as the shared loop sees them: a catalog entry's facts bound to its torch functions.

`info(name)` / `names()` are the catalog's and never import torch; `get(name)` imports the
benchmark's functions module (torch) the first time a run needs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.contract import catalog
from mlhpc.common.contract.catalog import BenchmarkInfo, Division, MemoryFormat, Target, info, names
from mlhpc.common.errors import ConfigError

__all__ = [
    "Benchmark",
    "BenchmarkFunctions",
    "BenchmarkInfo",
    "DataBundle",
    "Target",
    "get",
    "info",
    "names",
    "register",
]


@dataclass(frozen=True, kw_only=True)
class DataBundle:
    """What `build_data` returns: the loaders for this rank and the global sample counts."""

    train: Iterable[Any]
    validation: Iterable[Any]
    train_samples: int
    """Global number of training samples (logged as train_samples)."""
    eval_samples: int
    """Global number of validation samples (logged as eval_samples)."""
    set_epoch: Callable[[int], None] | None = None
    """Reshuffles the training shards for an epoch (DistributedSampler.set_epoch)."""
    loader: str = "torch"
    """Which pipeline feeds the loop (torch, dali), for the run's time breakdown."""


@dataclass(frozen=True, kw_only=True)
class BenchmarkFunctions:
    """A benchmark's torch side: the plain functions the shared loop and the runner call."""

    generate: Callable[..., Any]
    """generate(cfg, out_dir, num_samples=None, seed=0): synthetic data in the real format."""
    validate_dataset: Callable[..., Any]
    """validate_dataset(cfg, data_dir): raise DataError naming the first bad file."""
    build_model: Callable[..., Any]
    """build_model(cfg) -> torch.nn.Module."""
    build_data: Callable[..., DataBundle]
    """build_data(cfg, data_dir, ctx, seed) -> DataBundle."""
    build_optimizer: Callable[..., Any]
    """build_optimizer(cfg, model, ctx, steps_per_epoch) -> (optimizer, per-step LR scheduler)."""
    compute_loss: Callable[..., Any]
    """compute_loss(model, batch) -> scalar loss tensor; batch is already on the device."""
    evaluate: Callable[..., float]
    """evaluate(model, loader, ctx) -> the metric over all ranks' validation shards."""
    hyperparameters: Callable[..., dict[str, Any]]
    """hyperparameters(cfg, ctx) -> {MLLOG key: value} logged before init_stop."""
    run_end_events: Callable[..., dict[str, Any]] | None = None
    """run_end_events(cfg, result: RunResult) -> {MLLOG key: value} logged just before run_stop."""
    example_batch: Callable[..., Any] | None = None
    """example_batch(cfg, batch_size, device) -> a batch exactly as compute_loss takes it, at the
    config's real input size, built on `device` (torch.device("meta") too, where the model runs
    there); arbitrary but valid values (a detection target holds a box). `mlhpc characterize`
    needs it for every level that runs the model; without it those levels are skipped."""
    sample_bytes: Callable[..., int] | None = None
    """sample_bytes(cfg) -> bytes of one training sample in the dataset's on-disk format as
    `generate` writes it and the loader reads it (the arrays' payload; file headers aside).
    `mlhpc characterize` reports the I/O figures (FLOP per stored byte, input bandwidth) from it;
    without it they are null."""


@dataclass(frozen=True, kw_only=True)
class Benchmark(BenchmarkFunctions):
    """A catalog entry with its functions bound: what `get(name)` returns and the loop runs.

    The facts stay in `info` (one place each); the properties below read them from there.
    """

    info: BenchmarkInfo

    @classmethod
    def bind(cls, info: BenchmarkInfo, functions: BenchmarkFunctions) -> Benchmark:
        fields = {f.name: getattr(functions, f.name) for f in dataclasses.fields(BenchmarkFunctions)}
        return cls(info=info, **fields)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def config_class(self) -> type:
        return self.info.config_class

    @property
    def configs_dir(self) -> Path:
        return self.info.configs_dir

    @property
    def target(self) -> Target:
        return self.info.target

    @property
    def default_division(self) -> Callable[[Any], Division] | None:
        return self.info.default_division

    @property
    def memory_format(self) -> MemoryFormat:
        return self.info.memory_format

    @property
    def cpu_memory_format(self) -> MemoryFormat:
        return self.info.cpu_memory_format

    def config_path(self, name_or_path: str) -> Path:
        """'mini' / 'full' name a packaged config; anything else is a path to a YAML file."""
        return self.info.config_path(name_or_path)


# Benchmarks with their functions bound in this process: by get(), or given whole to register().
_BOUND: dict[str, Benchmark] = {}


def register(benchmark: Benchmark | BenchmarkInfo) -> Benchmark | BenchmarkInfo:
    """Adds a benchmark to this process's catalog (a script's or a test's own; installed packages
    use the entry point group instead); a name already known is refused, naming both."""
    facts = benchmark.info if isinstance(benchmark, Benchmark) else benchmark
    catalog.installed().add(facts, "register() in this process")
    if isinstance(benchmark, Benchmark):
        _BOUND[facts.name] = benchmark
    return benchmark


def get(name: str) -> Benchmark:
    """Benchmark `name` with its torch functions (imported now); ConfigError naming the known ones."""
    facts = info(name)
    bound = _BOUND.get(name)
    if bound is None:
        bound = _BOUND[name] = Benchmark.bind(facts, load_functions(facts))
    return bound


def load_functions(facts: BenchmarkInfo) -> BenchmarkFunctions:
    """The BenchmarkFunctions that `facts.functions` names; ConfigError (one line) if it cannot."""
    try:
        functions = catalog.load_object(facts.functions)
    except ConfigError as e:
        raise ConfigError(f"benchmark {facts.name}: {e}; check its functions= or reinstall it") from e
    if not isinstance(functions, BenchmarkFunctions):
        raise ConfigError(
            f"benchmark {facts.name}: {facts.functions} is a {type(functions).__name__}, "
            "not a BenchmarkFunctions"
        )
    return functions
