"""The benchmark catalog: each benchmark's facts, found through the `mlhpc.benchmarks` entry points.

Nothing here imports torch, so a login node can check a benchmark's name, config and run count
before queueing a job; the torch functions are bound later by `registry.get`. Built-in and
third-party benchmarks come the same way: an entry point `<name> = <package>:<BenchmarkInfo>`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Literal

from mlhpc.common.errors import ConfigError
from mlhpc.common.vocabulary import Division

GROUP = "mlhpc.benchmarks"
"""The entry point group every benchmark is declared in (built-ins in mlhpc's pyproject.toml)."""
OWN_DISTRIBUTION = "mlhpc"
"""The distribution whose entry points are the built-in benchmarks."""
REINSTALL = "reinstall mlhpc (pip install -e . in a checkout, else pip install mlhpc)"

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_OBJECT_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")
_log = logging.getLogger(__name__)

MemoryFormat = Literal["contiguous", "channels_last", "channels_last_3d"]
Workload = Literal["time_to_train", "automl"]


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
class BenchmarkInfo:
    """What is known about a benchmark without torch; the one place each of these facts lives."""

    name: str
    """Lower-case identifier, as in the submission's folders and `submission_benchmark`."""
    config_class: type
    """The frozen dataclass its YAML configs load into (torch-free, like common/training/loop_config)."""
    configs_dir: Path
    """The folder of its packaged configs: `<name>.yaml` for `--config <name>`."""
    target: Target
    strong_run_count: int
    """Runs a strong-scaling score needs (olympic mean over them); weak: at least this many models."""
    functions: str
    """'module:attribute' of its `BenchmarkFunctions` (the torch side), imported by registry.get."""
    rules_file: Path | None = None
    """Its mlperf_logging rule file; None: mlperf_logging's own rules for this benchmark name."""
    default_division: Callable[[Any], Division] | None = None
    """default_division(cfg) -> the division a run goes in when --division is not given (closed
    when None); e.g. open where the closed rules fix the real dataset's sample counts."""
    memory_format: MemoryFormat = "contiguous"
    """The layout the model runs fastest in on a GPU (loop.memory_format=auto picks it there)."""
    cpu_memory_format: MemoryFormat = "contiguous"
    """The layout it runs fastest in on a CPU, through oneDNN (loop.memory_format=auto there)."""
    workload: Workload = "time_to_train"
    """time_to_train: each seed trained to the target and timed, as MLPerf HPC scores it; automl: a
    search that runs for a duration and is scored by the operations its trials did (AIPerf),
    run by `runner` instead of the shared loop."""
    runner: str | None = None
    """'module:function' that `mlhpc run` hands an automl workload to: function(args, prepared) -> exit status."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"benchmark name {self.name!r}: use lower-case letters, digits and _")
        if not isinstance(self.functions, str) or not _OBJECT_REF.match(self.functions):
            raise ConfigError(
                f"benchmark {self.name}: functions={self.functions!r}; write 'package.module:ATTRIBUTE'"
            )
        if (self.workload == "automl") != (self.runner is not None) or not (
            self.runner is None or (isinstance(self.runner, str) and _OBJECT_REF.match(self.runner))
        ):
            raise ConfigError(
                f"benchmark {self.name}: an automl workload names its runner='package.module:function', "
                "and only it"
            )
        if isinstance(self.strong_run_count, bool) or not (
            isinstance(self.strong_run_count, int) and self.strong_run_count >= 1
        ):
            raise ConfigError(
                f"benchmark {self.name}: strong_run_count={self.strong_run_count!r}; use 1 or more"
            )

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

    def division_for(self, cfg: Any) -> Division:
        """The division a run of `cfg` goes in when --division is not given."""
        return self.default_division(cfg) if self.default_division is not None else "closed"


@dataclass
class Catalog:
    """Benchmarks by name, with where each came from; names that cannot be used keep their reason."""

    entries: dict[str, BenchmarkInfo] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    """name -> where it was declared, e.g. "entry point 'x = pkg:B' of pkg 1.0"."""
    refused: dict[str, str] = field(default_factory=dict)
    """name -> the one line saying why it cannot be used (a broken or duplicate declaration)."""
    has_builtins: bool = True
    """False when no entry point of mlhpc's own distribution was found: a stale or broken install."""

    def add(self, info: BenchmarkInfo, source: str) -> None:
        """Adds `info`; a second benchmark of the same name is refused, naming both."""
        if info.name in self.entries or info.name in self.refused:
            first = self.sources.get(info.name, "another declaration")
            raise ConfigError(
                f"benchmark {info.name!r} is declared twice: by {first} and by {source}; "
                "uninstall or rename one of them"
            )
        self.entries[info.name] = info
        self.sources[info.name] = source

    def find(self, name: str) -> BenchmarkInfo | None:
        """The benchmark called `name`, or None (for names read from files: never raises)."""
        return self.entries.get(name)

    def info(self, name: str) -> BenchmarkInfo:
        if name in self.refused:
            raise ConfigError(self.refused[name])
        found = self.entries.get(name)
        if found is not None:
            return found
        raise ConfigError(f"no benchmark {name!r}; known: {', '.join(self.names())}")

    def names(self) -> list[str]:
        """The benchmarks that can be used, sorted; ConfigError when mlhpc's own are missing."""
        if not self.has_builtins:
            raise ConfigError(f"mlhpc's own benchmarks are not registered; {REINSTALL}")
        return sorted(self.entries)


def describe(entry_point: EntryPoint) -> str:
    """The words that name an entry point and its distribution, for messages."""
    dist = getattr(entry_point, "dist", None)
    owner = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"entry point {f'{entry_point.name} = {entry_point.value}'!r} of {owner}"  # repr: one line


def _distribution_name(entry_point: EntryPoint) -> str | None:
    dist = getattr(entry_point, "dist", None)
    return None if dist is None else dist.name.lower().replace("_", "-")


def _load(entry_point: EntryPoint) -> BenchmarkInfo:
    """The BenchmarkInfo an entry point names; ConfigError (one line) for anything else."""
    where = describe(entry_point)
    try:
        loaded = entry_point.load()
    except Exception as e:  # a third party's import can raise anything; it must not stop the others
        raise ConfigError(f"{where} failed to load ({_one_line(e)}); fix or uninstall that package") from e
    if not isinstance(loaded, BenchmarkInfo):
        raise ConfigError(f"{where} is a {type(loaded).__name__}, not a BenchmarkInfo; fix that package")
    if loaded.name != entry_point.name:
        raise ConfigError(f"{where} holds benchmark {loaded.name!r}; name the entry point {loaded.name!r}")
    return loaded


def discover(found: Iterable[EntryPoint]) -> Catalog:
    """The catalog of the given entry points: each loaded, checked, and refused on its own if bad."""
    found = list(found)
    catalog = Catalog(has_builtins=any(_distribution_name(ep) == OWN_DISTRIBUTION for ep in found))
    declared: dict[str, list[EntryPoint]] = {}
    for entry_point in found:
        declared.setdefault(entry_point.name, []).append(entry_point)
    for name, points in declared.items():
        where = " and ".join(describe(ep) for ep in points)
        if len(points) > 1:
            catalog.refused[name] = f"benchmark {name!r} is declared twice: {where}; uninstall one of them"
            catalog.sources[name] = where
            continue
        try:
            catalog.add(_load(points[0]), where)
        except ConfigError as e:
            catalog.refused[name] = str(e)
            catalog.sources[name] = where
    return catalog


@functools.cache
def installed() -> Catalog:
    """This process's catalog: the installed `mlhpc.benchmarks` entry points, loaded once."""
    catalog = discover(entry_points(group=GROUP))
    for reason in catalog.refused.values():
        _log.warning("%s", reason)
    return catalog


def info(name: str) -> BenchmarkInfo:
    """The facts of benchmark `name`; ConfigError naming the known ones (or the fix) otherwise."""
    return installed().info(name)


def find(name: str) -> BenchmarkInfo | None:
    """The facts of benchmark `name`, or None; for names read from a submission's folders."""
    return installed().find(name)


def names() -> list[str]:
    """The benchmarks that can be used, sorted; ConfigError when mlhpc's own are not installed."""
    return installed().names()


def required_run_count(benchmark: str) -> int | None:
    """Runs a strong-scaling score needs (weak: at least this many models); None if unknown.

    The MLPerf HPC benchmarks' counts (cosmoflow 10, deepcam 5, oc20 5, openfold 10) are
    mlperf_logging's, as the official checker's; the others' come from the catalog.
    """
    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    official = _ALL_RESULT_FILE_COUNTS["hpc"].get(benchmark)
    if official is not None:
        return official
    found = find(benchmark)
    return None if found is None else found.strong_run_count


def load_object(reference: str) -> Any:
    """The object 'package.module:attribute' names (importing the module); ConfigError if none."""
    if not _OBJECT_REF.match(reference):
        raise ConfigError(f"{reference!r} is not 'package.module:attribute'")
    module_name, _, attribute = reference.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except Exception as e:  # a benchmark's import can raise anything; say which and keep the chain
        raise ConfigError(f"cannot load {reference} ({_one_line(e)})") from e
    return found


def _one_line(error: BaseException) -> str:
    """'Type: message' on one line, whatever the message holds (a SyntaxError's spans lines)."""
    return " ".join(f"{type(error).__name__}: {error}".split())
