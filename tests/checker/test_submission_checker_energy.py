"""Energy from power logs, against mlperf_logging.result_summarizer on the same folders.

Power logs are written by mlperf_logging's own mllog logger (the official format: the keys of
mllog.constants, as its examples/power/power_measurement.py writes them) beside real HPC result
logs; the official `_compute_strong_score_standalone` / `_compute_weak_score_standalone` read the
same folder.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.submission_checker import check_submission
from mlhpc.submission_checker.energy import PowerRecord, node_energy_j
from tests.helpers.submissions import (
    DEEPCAM,
    SYSTEM,
    add_power,
    make_entry,
)


def official(entry: Path, scaling: str, ruleset: str) -> tuple[object, object]:
    from mlperf_logging.result_summarizer import result_summarizer as rs

    if scaling == "strong":
        score, power, _ = rs._compute_strong_score_standalone(
            entry.name, entry.parent.parent.name, True, str(entry), "hpc", ruleset
        )
        return score, power
    scores, power = rs._compute_weak_score_standalone(
        entry.name, entry.parent.parent.name, True, str(entry), "hpc", ruleset
    )
    return scores, power[f"{entry.name}:time_to_train_all"]


@pytest.mark.parametrize("case", range(4))
def test_strong_energy_is_the_official_summarizers(tmp_path: Path, case: int) -> None:
    org, entry = make_entry(tmp_path, DEEPCAM, SYSTEM, "strong", [f"result_{i}.txt" for i in range(5)])
    rng = random.Random(case)
    add_power(
        entry, rng, nodes=1 + case, switches=case % 2, eff=None if case < 2 else 0.93, stop_line=case != 3
    )
    if case == 1:  # a non-compliant run: the summarizer drops it first, energy follows the times
        target = entry / "result_2.txt"
        target.write_text(
            target.read_text(encoding="latin-1").replace('"key": "run_stop"', '"key": "run_stopp"')
        )
    report = check_submission(org, ruleset="2.0.0")
    ours = report.entries[0]
    score, power = official(entry, "strong", "2.0.0")
    assert ours.score_min == score
    assert isinstance(power, float)
    assert ours.energy_j == pytest.approx(power, rel=1e-12, abs=0)


def test_weak_energy_and_models_per_kwh(tmp_path: Path) -> None:
    # The five deepcam runs as five models (the official weak scoring on Fujitsu's cosmoflow logs
    # takes minutes: its parser's regex is slow on their long lines).
    files = [f"result_{i}.txt" for i in range(5)]
    org, entry = make_entry(tmp_path, DEEPCAM, SYSTEM, "weak", files)
    add_power(entry, random.Random(7), nodes=3, switches=1, period_ms=900.0)
    report = check_submission(org, ruleset="2.0.0")
    ours = report.entries[0]
    scores, power = official(entry, "weak", "2.0.0")
    assert ours.energy_j == pytest.approx(power, rel=1e-12, abs=0)
    assert ours.num_models == scores["deepcam:number_of_models"] == 5
    assert ours.energy_total_j is not None
    assert ours.models_per_kwh == pytest.approx(5 / (ours.energy_total_j / 3.6e6))
    assert not [f for f in ours.findings if f.rule == "energy"]


def test_bad_power_logs_give_findings_not_tracebacks(tmp_path: Path) -> None:
    org, entry = make_entry(tmp_path, DEEPCAM, SYSTEM, "strong", [f"result_{i}.txt" for i in range(5)])
    add_power(entry, random.Random(1), period_ms=1500.0)
    report = check_submission(org, ruleset="2.0.0")
    gaps = [f for f in report.entries[0].findings if f.rule == "energy"]
    assert gaps and all("ms apart" in f.message for f in gaps)
    assert report.entries[0].energy_j is not None
    (entry / "power" / "result_3" / "node_0.txt").write_text(':::MLLOG {"key": "power_reading"}\n')
    shutil.rmtree(entry / "power" / "result_4")
    node = entry / "power" / "result_1" / "node_1.txt"
    node.write_text(
        node.read_text()
        .replace('"value": null', '"value": "x"')
        .replace('power_reading", "value": ', 'power_reading", "value": "w", "x": ')
    )
    report = check_submission(org, ruleset="2.0.0")
    (e,) = report.entries
    assert e.energy_j is None and e.score_min is not None
    assert [f.rule for f in e.findings if f.rule == "energy"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    readings=st.lists(
        st.tuples(st.floats(0, 1e4, allow_nan=False), st.floats(0, 5e3, allow_nan=False)),
        min_size=1,
        max_size=40,
    ),
    ttt=st.floats(1, 1e7, allow_nan=False),
)
def test_node_arithmetic_is_the_official_one(readings: list[tuple[float, float]], ttt: float) -> None:
    from mlperf_logging.compliance_checker.mlp_parser.ruleset_300 import LogLine
    from mlperf_logging.result_summarizer.result_summarizer import _compute_power_node

    records = [PowerRecord("power_measurement_start", 0.0, None, 1)]
    records += [PowerRecord("power_reading", t + 1, w, i + 2) for i, (t, w) in enumerate(readings)]
    records.append(PowerRecord("power_measurement_stop", 2e4, None, len(records) + 1))
    lines = [LogLine("", r.time_ms, r.key, {"value": r.value, "metadata": {}}, r.line) for r in records]
    assert node_energy_j(records, ttt) == _compute_power_node(lines, ttt)
