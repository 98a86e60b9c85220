"""HPC AI500's score of a run, one formula for the run that logs it and the checker that recomputes it.

    FLOPS       = forward + backward FLOPs per sample x training samples an epoch x epochs
                  / the run's seconds (run_start .. run_stop: loading, evaluation and communication in)
    Valid FLOPS = FLOPS x (quality / target)^n

The target is read from the benchmark's rule file, the number the compliance checker enforces,
so it is stored once. No torch here: `mlhpc check` runs on a login node.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import yaml

from mlhpc.common.contract import catalog
from mlhpc.common.errors import ConfigError

BENCHMARKS = ("extreme_weather",)
"""The HPC AI500 benchmarks: a fixed-epoch run of one of them is scored by its Valid FLOPS."""

# The target inside a rule's check: `v['value'] >= 0.35` (quality higher is better).
_AT_LEAST = re.compile(r"v\[\s*'value'\s*\]\s*>=\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")


def run_flops(flops_per_sample: float, train_samples: float, epochs: int, run_seconds: float) -> float | None:
    """HPC AI500's FLOPS of a run: its training FLOPs over its time, run_start to run_stop.

    Training FLOPs = forward + backward FLOPs per sample x samples an epoch x epochs trained; the time
    is the whole run (data loading, evaluation and communication included), not the compute seconds.
    None when a value is not a finite, positive number (then the run has no FLOPS to score).
    """
    values = (flops_per_sample, train_samples, float(epochs), run_seconds)
    if not all(math.isfinite(v) for v in values) or run_seconds <= 0 or min(values) < 0:
        return None
    return flops_per_sample * train_samples * epochs / run_seconds


def valid_flops(flops: float, quality: float, target: float, exponent: float) -> float:
    """HPC AI500's Valid FLOPS: FLOPS x (quality / target)^n, the score of a fixed-epoch run.

    Source: HPC AI500 V2.0 (Jiang et al., "HPC AI500 V2.0: The Methodology, Tools, and Metrics for
    Benchmarking HPC AI Systems", arXiv:2007.00279; ranking at benchcouncil.org/HPCAI500/ranking.html):
    Valid FLOPS = FLOPS x penalty, penalty = (achieved quality / target quality)^n, a penalty for
    missing the target (above it the factor exceeds 1, applied as published). n = 5 is their image
    classification value; none is published for extreme weather, so the benchmark logs its n as
    `vflops_exponent` (quality.vflops_exponent, 5 by default). Quality is higher-is-better (mAP).
    """
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target quality {target} must be positive and finite")
    if not (math.isfinite(exponent) and exponent > 0):
        raise ValueError(f"Valid FLOPS exponent n={exponent} must be positive and finite")
    if not (math.isfinite(quality) and quality >= 0 and math.isfinite(flops) and flops >= 0):
        raise ValueError(f"FLOPS {flops} and quality {quality} must be finite and not negative")
    return flops * (quality / target) ** exponent


def rule_target(rules_file: Path, metric: str) -> float:
    """The `v['value'] >= X` of `metric`'s rule in an mlperf_logging rule file (the X every
    target-mode log must reach); ConfigError naming the file when it holds not exactly one."""
    try:
        records = yaml.safe_load(Path(rules_file).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{rules_file} cannot be read as a rule file ({e}); reinstall mlhpc") from e
    checks = [
        str(text)
        for record in records or []
        if isinstance(record, dict)
        and isinstance(record.get("KEY"), dict)
        and record["KEY"].get("NAME") == metric
        for name in ("CHECK", "ATLEAST_ONE_CHECK")
        for text in _as_list(record["KEY"].get(name))
    ]
    found = {float(number) for check in checks for number in _AT_LEAST.findall(check)}
    if len(found) != 1:
        raise ConfigError(
            f"{rules_file}: the {metric} rule holds {sorted(found) or 'no'} `v['value'] >= X` target(s); "
            "it needs exactly one"
        )
    return found.pop()


def _as_list(value: object) -> list[object]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


@functools.cache
def target(benchmark: str | None) -> float | None:
    """The target quality of an HPC AI500 benchmark, as its rule file checks it; None for any other
    benchmark (or one not installed)."""
    info = catalog.find(benchmark) if benchmark in BENCHMARKS else None
    if info is None or info.rules_file is None:
        return None
    return rule_target(info.rules_file, info.target.metric)
