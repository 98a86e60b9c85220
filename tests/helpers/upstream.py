"""The mlperf_logging release the checker is tested with, and the internals it depends on (a test
guard: the product never reads it, so it lives with the tests).

The checker runs the official compliance engine, its rule YAMLs and RCP data, replaces one helper
of the engine's parser (guarded by a source hash in `compliance`), and scores energy with a copy of
the result summarizer's power arithmetic (tested against it). `upstream_problems` says what no
longer holds for the installed release; tests/checker/test_submission_checker_upstream.py fails with it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect

from mlhpc.common.vocabulary import RULESETS
from mlhpc.submission_checker.compliance import KNOWN_STRIP_AND_DEDUP, USAGE, known_rulesets

DISTRIBUTION = "mlperf-logging"
TESTED_VERSIONS = ("4.1.68",)
"""Releases the tests passed with (pyproject.toml pins mlperf-logging to this range)."""
# sha256 of the source of the result summarizer's functions `energy.py` reproduces (4.1.68).
SUMMARIZER_SOURCES = {
    "_compute_total_power": "cebf845a7066081c8a4b0fdf860e86f3e8b95658743f1b33f5fa52e00e64bf26",
    "_compute_power_node": "254d541d3d30e5cdf669a1bfc1472b0bd12b2443ef1d8e7418a8a591789e72f8",
    "_compute_power_sw": "e04dbbda37e2054c1d976f7cf7e5fef30241e93a526dfc8ac46ff3ba4aeb9a83",
    "_compute_olympic_average": "a7d7ef8eb3097e15f2270ab356701094234d8ab2e7f75b9009d5465c9a401d63",
    "_index_olympic_average": "04d60b7b68a9b5e29bf042db84c0dc4c9ed46f522f5c1ba0ee64e28eb4f19f2c",
    "_compute_weak_score_standalone": "73a06551acf0362f7704779ab7649485c1f85463e6eb06c8b45656413cc20a30",
    "_compute_strong_score_standalone": "36716cf9699a0592ded64067936d8e416024c6c13b912b518ec405d1671581a6",
}


def _digest(function: object) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()  # type: ignore[arg-type]


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def upstream_problems() -> list[str]:
    """One line per way the installed mlperf_logging differs from the tested one ([] when none)."""
    problems: list[str] = []
    version = installed_version()
    if version not in TESTED_VERSIONS:
        problems.append(
            f"{DISTRIBUTION} {version} is installed; the checker is tested with {', '.join(TESTED_VERSIONS)}"
        )
    missing = [r for r in RULESETS if r not in known_rulesets()]
    if missing:
        problems.append(f"no {USAGE} rule files for ruleset(s) {', '.join(missing)}")
    for ruleset in RULESETS:
        module = f"mlperf_logging.compliance_checker.mlp_parser.ruleset_{ruleset.replace('.', '')}"
        try:
            found = _digest(importlib.import_module(module).strip_and_dedup)
        except (ImportError, AttributeError, OSError, TypeError) as e:
            problems.append(f"{module}.strip_and_dedup cannot be read: {e}")
            continue
        if found != KNOWN_STRIP_AND_DEDUP:
            problems.append(f"{module}.strip_and_dedup changed (sha256 {found})")
    from mlperf_logging.result_summarizer import result_summarizer

    for name, known in SUMMARIZER_SOURCES.items():
        function = getattr(result_summarizer, name, None)
        found = None if function is None else _digest(function)
        if found != known:
            problems.append(f"result_summarizer.{name} changed (sha256 {found}); energy.py reproduces it")
    return problems
