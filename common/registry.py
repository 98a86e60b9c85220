"""The registry of benchmarks: each is a small frozen spec of functions the shared loop calls."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlhpc.common.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Target:
    """The quality a run must reach: the MLLOG metric key and which way is better."""

    metric: str
    """MLLOG key the evaluation is logged under, e.g. eval_error or eval_accuracy."""
    direction: Literal["min", "max"]
    """min: reached when value <= threshold; max: reached when value >= threshold."""

    def reached(self, value: float, threshold: float) -> bool:
        return value <= threshold if self.direction == "min" else value >= threshold


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
class Benchmark:
    """A benchmark as the shared loop sees it. Every field is a plain function or value."""

    name: str
    config_class: type
    configs_dir: Path
    target: Target
    strong_run_count: int
    """Runs a strong-scaling score needs (olympic mean over them)."""
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
    default_division: Callable[..., Literal["closed", "open"]] | None = None
    """default_division(cfg) -> the division a run goes in when --division is not given (closed
    when None); e.g. open where the closed rules fix the real dataset's sample counts."""
    run_end_events: Callable[..., dict[str, Any]] | None = None
    """run_end_events(cfg, result: RunResult) -> {MLLOG key: value} logged just before run_stop."""
    memory_format: Literal["contiguous", "channels_last", "channels_last_3d"] = "contiguous"
    """The layout the model runs fastest in on a GPU (loop.memory_format=auto picks it there)."""

    def config_path(self, name_or_path: str) -> Path:
        """'mini' / 'full' name a packaged config; anything else is a path to a YAML file."""
        candidate = self.configs_dir / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
        path = Path(name_or_path)
        if path.is_file():
            return path
        known = ", ".join(sorted(p.stem for p in self.configs_dir.glob("*.yaml")))
        raise ConfigError(f"no config {name_or_path!r} for {self.name}; known: {known}, or a YAML path")


_REGISTRY: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in _REGISTRY:
        raise ValueError(f"benchmark {benchmark.name!r} is registered twice")
    _REGISTRY[benchmark.name] = benchmark
    return benchmark


def get(name: str) -> Benchmark:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"no benchmark {name!r}; known: {', '.join(names())}") from None


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    import mlhpc.benchmarks  # noqa: F401  (registers the benchmarks it ships)
