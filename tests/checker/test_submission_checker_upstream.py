"""The installed mlperf_logging is the one the checker was tested with (see docs/CHECKING.md, "A new
mlperf-logging release")."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import upstream

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_installed_mlperf_logging_is_the_tested_one() -> None:
    problems = upstream.upstream_problems()
    assert not problems, (
        "mlperf_logging differs from the release the checker is tested with:\n  "
        + "\n  ".join(problems)
        + "\nRun the checker's tests and perf/check_speed.py on the published rounds with it, then "
        "update TESTED_VERSIONS and the hashes in tests/helpers/upstream.py and the pin in "
        "pyproject.toml (docs/CHECKING.md: A new mlperf-logging release)."
    )


def test_pyproject_pins_the_tested_range() -> None:
    (line,) = [t for t in PYPROJECT.read_text().splitlines() if '"mlperf-logging' in t]
    lowest, highest = min(upstream.TESTED_VERSIONS), max(upstream.TESTED_VERSIONS)
    found = re.search(r'"mlperf-logging>=([\d.]+),<=([\d.]+)"', line)
    assert found is not None, f"pyproject.toml: {line.strip()} has no upper bound; pin >=LOW,<=HIGH"
    assert found.groups() == (lowest, highest), (
        f"pyproject.toml pins {found.groups()}, tested {lowest}..{highest}"
    )


def test_a_changed_helper_is_named(monkeypatch) -> None:
    """The guard is real: a release whose helper differs is reported, naming the function."""
    monkeypatch.setitem(upstream.SUMMARIZER_SOURCES, "_compute_power_node", "0" * 64)
    monkeypatch.setattr(upstream, "TESTED_VERSIONS", ("0.0.1",))
    problems = upstream.upstream_problems()
    assert any("result_summarizer._compute_power_node changed" in p for p in problems)
    assert any("is installed; the checker is tested with 0.0.1" in p for p in problems)
