"""Impossible numbers are findings, never a score (issue 31).

Real HPC v2.0 result logs with power logs written by mlperf_logging's own logger; single values
in them are replaced by negative, non-finite (`1e400`, `NaN`, `"inf"`), huge or reversed ones.
The checker must name the file and line, leave the run (or its energy) out of the score, and
never crash.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mlhpc.submission_checker import CheckReport, check_submission
from mlhpc.submission_checker.energy import MAX_WATTS
from mlhpc.submission_checker.logparse import MAX_TIME_MS
from mlhpc.submission_checker.scoring import MAX_TIME_TO_TRAIN_MIN, impossible_minutes
from tests.helpers.cli import mlhpc_cli
from tests.helpers.submissions import DEEPCAM, SYSTEM, add_power, make_entry

TOKEN = ":::MLLOG "
PLACEHOLDER = "__mlhpc_value__"

# JSON text of a value: what a damaged meter, an overflow or a forger could write.
RAW_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),  # NaN, Infinity, -0.0, 1e308
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(
        ["1e400", "-1e400", "1e308", "-1", "0", "0.0", '"inf"', '"nan"', '"1e400"', '"-5"', "null", "true"]
    ),
    st.sampled_from(["[]", "{}", '"x"', "3000", "1.7e12", "1e13", "1.1e13"]),
)


@pytest.fixture(scope="module")
def submission(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(organisation folder, its strong deepcam entry): five real runs, two nodes and a switch each."""
    org, entry = make_entry(
        tmp_path_factory.mktemp("impossible"),
        DEEPCAM,
        SYSTEM,
        "strong",
        [f"result_{i}.txt" for i in range(5)],
    )
    add_power(entry, random.Random(3), nodes=2, switches=1, eff=0.95)
    return org, entry


def mllog_lines(path: Path) -> list[tuple[int, dict]]:
    """(0-based index, record) of every :::MLLOG line."""
    found = []
    for index, text in enumerate(path.read_text(encoding="latin-1").splitlines(keepends=True)):
        if TOKEN in text:
            found.append((index, json.loads(text.split(TOKEN, 1)[1])))
    return found


def replaced(path: Path, index: int, field: str, raw: str) -> None:
    """Line `index` of `path` with `field` ("value" or "time_ms") written as the JSON text `raw`."""
    lines = path.read_text(encoding="latin-1").splitlines(keepends=True)
    prefix, part = lines[index].split(TOKEN, 1)
    record = json.loads(part)
    record[field] = PLACEHOLDER
    lines[index] = prefix + TOKEN + json.dumps(record).replace(f'"{PLACEHOLDER}"', raw) + "\n"
    path.write_text("".join(lines), encoding="latin-1")


def as_time(raw: str) -> float | None:
    """time_ms as the log reader takes it (float() of the JSON value); None when it is not one."""
    try:
        return float(json.loads(raw))
    except (TypeError, ValueError, OverflowError):
        return None


def impossible_time(time_ms: float) -> bool:
    return not math.isfinite(time_ms) or not 0 <= time_ms <= MAX_TIME_MS


def impossible_watts(raw: str) -> bool:
    value = json.loads(raw)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False  # not a number at all: a warning and no energy, checked apart
    return not math.isfinite(value) or not 0 <= value <= MAX_WATTS


@contextlib.contextmanager
def restored(path: Path) -> Iterator[None]:
    """The file as it was after the block, whatever the block wrote into it."""
    before = path.read_bytes()
    try:
        yield
    finally:
        path.write_bytes(before)


def assert_nothing_impossible_scored(report: CheckReport) -> None:
    """The invariants: every scored run has a possible time, every score and energy is positive."""
    (entry,) = report.entries
    for run in entry.runs:
        if run.dropped is None:
            assert run.minutes is not None and 0 < run.minutes <= MAX_TIME_TO_TRAIN_MIN, run
    for value in (entry.score_raw_min, entry.score_min, entry.energy_j):
        assert value is None or (math.isfinite(value) and value > 0), entry


def found_at(report: CheckReport, path: Path, line: int, rules: set[str]) -> list:
    (entry,) = report.entries
    return [
        f for f in entry.findings if Path(f.path).name == path.name and f.line == line and f.rule in rules
    ]


POWER_TARGETS = ("power_reading", "power_measurement_stop", "power_measurement_start", "conversion_eff")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    result=st.integers(0, 4),
    node=st.sampled_from(["node_0.txt", "node_1.txt", "sw_0.txt"]),
    target=st.sampled_from((*POWER_TARGETS, "interconnect_power_est")),
    field=st.sampled_from(["value", "time_ms"]),
    pick=st.integers(0, 10**6),
    raw=RAW_VALUES,
)
def test_random_power_values_are_never_scored(
    submission: tuple[Path, Path], result: int, node: str, target: str, field: str, pick: int, raw: str
) -> None:
    org, entry = submission
    path = entry / "power" / f"result_{result}" / node
    candidates = [(i, r) for i, r in mllog_lines(path) if r["key"] == target]
    if not candidates:
        return  # a switch log has no readings, a node log no interconnect estimate
    index, _ = candidates[pick % len(candidates)]
    if field == "value" and target in ("power_measurement_start", "power_measurement_stop"):
        field = "time_ms"  # their value is null; their time is what can be impossible
    with restored(path):
        replaced(path, index, field, raw)
        report = check_submission(org, ruleset="2.0.0")
    assert_nothing_impossible_scored(report)
    if field == "time_ms":
        time_ms = as_time(raw)
        start = next(r["time_ms"] for _, r in mllog_lines(path) if r["key"] == "power_measurement_start")
        reversed_stop = target == "power_measurement_stop" and time_ms is not None and time_ms < start
        impossible = time_ms is not None and (impossible_time(time_ms) or reversed_stop)
    else:
        impossible = impossible_watts(raw) or (target == "conversion_eff" and impossible_eff(raw))
    event(f"impossible: {impossible}")
    if impossible:
        assert report.entries[0].energy_j is None
        assert found_at(report, path, index + 1, {"impossible-value"}), (raw, report.entries[0].findings)


def impossible_eff(raw: str) -> bool:
    value = json.loads(raw)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 < value <= 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    result=st.integers(0, 4),
    key=st.sampled_from(["run_stop", "run_start"]),
    raw=st.one_of(RAW_VALUES, st.floats(-1e12, 1e12, allow_nan=False).map(lambda d: f"delta:{d!r}")),
)
def test_random_run_times_are_never_scored(
    submission: tuple[Path, Path], result: int, key: str, raw: str
) -> None:
    org, entry = submission
    path = entry / f"result_{result}.txt"
    lines = mllog_lines(path)
    start = next(r["time_ms"] for _, r in lines if r["key"] == "run_start")
    index = next(i for i, r in lines if r["key"] == key)
    if raw.startswith("delta:"):  # a stop before, at, or far after the start; a start after the stop
        raw = repr(start + float(raw.split(":", 1)[1]))
    with restored(path):
        replaced(path, index, "time_ms", raw)
        report = check_submission(org, ruleset="2.0.0")
    assert_nothing_impossible_scored(report)
    time_ms = as_time(raw)
    run = next(r for r in report.entries[0].runs if Path(r.file).name == path.name)
    event(f"time_ms: {'unreadable' if time_ms is None else impossible_time(time_ms)}")
    if time_ms is None:
        assert run.dropped == "not counted" and found_at(report, path, index + 1, {"log-parse"})
    elif impossible_time(time_ms):
        assert run.dropped == "not counted" and found_at(report, path, index + 1, {"impossible-value"})
    else:
        stop = next((i, r["time_ms"]) for i, r in lines if r["key"] == "run_stop")
        begin, end = (time_ms, stop[1]) if key == "run_start" else (start, time_ms)
        if impossible_minutes((end - begin) / 60_000):
            assert run.dropped == "not counted" and found_at(report, path, stop[0] + 1, {"timestamps"})


def test_the_issues_energies_are_errors_not_scores(submission: tuple[Path, Path], tmp_path: Path) -> None:
    """-2.2 kWh (negative readings), an overflow to infinity, and a stop stamped before the start."""
    org, entry = submission
    copy = tmp_path / "Org"
    shutil.copytree(org, copy)
    power = copy / entry.relative_to(org) / "power"
    node = power / "result_0" / "node_0.txt"
    readings = [i for i, r in mllog_lines(node) if r["key"] == "power_reading"]
    for i in readings:
        replaced(node, i, "value", "-3000")
    replaced(power / "result_1" / "node_1.txt", readings[3], "value", "1e308")
    sw = power / "result_2" / "sw_0.txt"
    stop = next(i for i, r in mllog_lines(sw) if r["key"] == "power_measurement_stop")
    replaced(sw, stop, "time_ms", "1000")
    report = check_submission(copy, ruleset="2.0.0")
    (e,) = report.entries
    assert e.energy_j is None and e.score_min is not None
    errors = [f for f in e.findings if f.rule == "impossible-value"]
    assert [f.line for f in errors] == [readings[0] + 1], "the first impossible line of the first run"
    assert "negative" in errors[0].message and errors[0].path.endswith("result_0/node_0.txt")
    proc = mlhpc_cli(["check", str(copy), "--ruleset", "2.0.0"], tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "PASSED" not in proc.stdout and "kWh" not in proc.stdout
    assert "node_0.txt:" in proc.stdout and "impossible-value" in proc.stdout


def test_a_reversed_or_absurd_run_is_not_scored(submission: tuple[Path, Path], tmp_path: Path) -> None:
    org, entry = submission
    copy = tmp_path / "Org"
    shutil.copytree(org, copy)
    results = copy / entry.relative_to(org)
    for name, raw in (("result_1.txt", "-1"), ("result_3.txt", "1e400")):
        path = results / name
        index = next(i for i, r in mllog_lines(path) if r["key"] == "run_stop")
        replaced(path, index, "time_ms", raw)
    (e,) = check_submission(copy, ruleset="2.0.0").entries
    assert e.score_min is None, "two runs left out: olympic scoring drops at most one"
    dropped = {Path(r.file).name: r.dropped for r in e.runs}
    assert dropped["result_1.txt"] == dropped["result_3.txt"] == "not counted"
    rules = {(Path(f.path).name, f.rule, f.severity) for f in e.findings}
    assert ("result_1.txt", "impossible-value", "error") in rules, "a negative time_ms"
    assert ("result_3.txt", "impossible-value", "error") in rules, "1e400 is infinite"
    assert ("deepcam", "score", "error") in rules
