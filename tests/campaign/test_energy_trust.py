"""Energy from forged power logs is an error finding, never a score: a second
power_measurement_start or stop, a conversion efficiency or a node reading outside what hardware
does (subnormal, zero, infinite, megawatt), more node logs than the system has nodes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.submission_checker import check_submission
from mlhpc.submission_checker.energy import (
    MAX_NODE_WATTS,
    MIN_CONVERSION_EFF,
    MIN_NODE_WATTS,
    EnergyError,
    PowerRecord,
    check_possible,
    run_energy_j,
    system_nodes,
)

DATA = Path(__file__).parents[1] / "data"
HOREKA = "horeka_gpu_n512_pytorch1.13"
DEEPCAM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "results" / HOREKA / "strong" / "deepcam"
SYSTEM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "systems" / f"{HOREKA}.json"


def _line(key: str, time_ms: float, value: object = None) -> str:
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": time_ms, "metadata": {}}) + "\n"


def power_log(
    path: Path, start: float = 1000.0, *, extra: str = "", eff: float | None = None, watts=1500.0
) -> Path:
    """A clean node log: start, a reading every 500 ms for 10 s, stop; `extra` lines appended."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [_line("power_measurement_start", start)]
    if eff is not None:
        lines.append(_line("conversion_eff", start, eff))
    lines += [_line("power_reading", start + 500 * i, watts) for i in range(1, 21)]
    lines.append(_line("power_measurement_stop", start + 10_000))
    path.write_text("".join(lines) + extra)
    return path


def test_the_control_a_clean_log_scores(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    power_log(entry / "power" / "result_0" / "node_0.txt")
    energy, findings = run_energy_j(entry, "result_0.txt", 10_000.0, system_node_count=1)
    assert energy == pytest.approx(1500.0 * 10.0) and not findings


@pytest.mark.parametrize(
    "extra",
    [
        _line("power_measurement_start", 20_000.0) + _line("power_reading", 30_000.0, 1500.0),
        _line("power_measurement_stop", 12_000.0),
    ],
    ids=["second start", "second stop"],
)
def test_a_second_start_or_stop_is_an_error_not_a_score(tmp_path: Path, extra: str) -> None:
    entry = tmp_path / "entry"
    power_log(entry / "power" / "result_0" / "node_0.txt", extra=extra)
    energy, findings = run_energy_j(entry, "result_0.txt", 10_000.0)
    assert energy is None
    assert [f.severity for f in findings] == ["error"] and "a second power_measurement" in findings[0].message


@settings(max_examples=300, deadline=None)
@given(
    watts=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
    | st.sampled_from([1e-300, 5e-324, 0.0, -0.0, 1e6])
)
def test_a_node_reading_outside_what_a_node_draws_is_impossible(watts: float) -> None:
    records = [
        PowerRecord("power_measurement_start", 0.0, None, 1),
        PowerRecord("power_reading", 500.0, watts, 2),
        PowerRecord("power_measurement_stop", 1000.0, None, 3),
    ]
    try:
        check_possible(records, "node")
    except EnergyError as e:
        assert e.impossible and not (math.isfinite(watts) and MIN_NODE_WATTS <= watts <= MAX_NODE_WATTS)
        return
    assert MIN_NODE_WATTS <= watts <= MAX_NODE_WATTS


@settings(max_examples=300, deadline=None)
@given(
    eff=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
    | st.sampled_from([1e-300, 0.49, 0.5, 1.0])
)
def test_a_conversion_efficiency_outside_half_to_one_is_impossible(eff: float) -> None:
    records = [
        PowerRecord("power_measurement_start", 0.0, None, 1),
        PowerRecord("conversion_eff", 0.0, eff, 2),
    ]
    try:
        check_possible(records, "node")
    except EnergyError as e:
        assert e.impossible and not (MIN_CONVERSION_EFF <= eff <= 1)
        return
    assert MIN_CONVERSION_EFF <= eff <= 1


def test_more_node_logs_than_nodes_is_an_error(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    for n in range(3):
        power_log(entry / "power" / "result_0" / f"node_{n}.txt")
    assert run_energy_j(entry, "result_0.txt", 10_000.0, system_node_count=3)[0] is not None
    energy, findings = run_energy_j(entry, "result_0.txt", 10_000.0, system_node_count=2)
    assert energy is None and findings[0].severity == "error" and "3 node power logs" in findings[0].message


@pytest.mark.parametrize(
    ("value", "nodes"),
    [
        ("18", 18),
        (" 4 ", 4),
        (18, 18),
        ("0", None),
        ("-1", None),
        ("²", None),
        (True, None),
        ("9" * 5000, None),
    ],
)
def test_system_nodes_reads_only_a_positive_count(value: object, nodes: int | None) -> None:
    assert system_nodes({"number_of_nodes": value}) == nodes


def test_a_forged_entry_fails_the_check_end_to_end(tmp_path: Path) -> None:
    """A real entry with clean logs passes its energy; a second start in one run's log fails it."""
    org = tmp_path / "hpc_results_v3.0" / "Org"
    entry = org / "results" / HOREKA / "strong" / "deepcam"
    entry.mkdir(parents=True)
    (org / "systems").mkdir()
    shutil.copyfile(SYSTEM, org / "systems" / SYSTEM.name)
    for i in range(5):
        shutil.copyfile(DEEPCAM / f"result_{i}.txt", entry / f"result_{i}.txt")
        start = stop = None
        for text in (entry / f"result_{i}.txt").read_text(encoding="latin-1").splitlines():
            if ":::MLLOG " in text:
                record = json.loads(text.split(":::MLLOG ", 1)[1])
                start = record["time_ms"] if record["key"] == "run_start" and start is None else start
                stop = record["time_ms"] if record["key"] == "run_stop" and stop is None else stop
        node = entry / "power" / f"result_{i}" / "node_0.txt"
        node.parent.mkdir(parents=True)
        readings = [_line("power_reading", t, 1500.0) for t in range(int(start), int(stop) + 1000, 500)]
        node.write_text(
            _line("power_measurement_start", start)
            + "".join(readings)
            + _line("power_measurement_stop", stop)
        )
    clean = check_submission(org, ruleset="2.0.0").entries[0]
    assert clean.energy_j is not None and not [f for f in clean.findings if f.rule == "impossible"]
    node = entry / "power" / "result_2" / "node_0.txt"
    node.write_text(
        node.read_text()
        + _line("power_measurement_start", stop + 1)
        + _line("power_reading", stop + 1e7, 1500.0)
    )
    forged = check_submission(org, ruleset="2.0.0").entries[0]
    assert forged.energy_j is None
    assert [
        f for f in forged.findings if f.severity == "error" and "second power_measurement_start" in f.message
    ]
