"""HPC AI500's fixed-epoch mode: the rules accept a run below the target, the checker scores it with
the Valid FLOPS penalty over run_start..run_stop, and a target-mode run below target still fails."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.submission_checker.compliance import analyse_log
from mlhpc.submission_checker.logparse import parse_log
from mlhpc.submission_checker.scoring import fixed_epoch_score, run_flops, valid_flops_penalty
from tests.helpers.mllog_files import RULES_FILE, _good_events, _write_log, official_compliance

BELOW = (0.21, 0.28)  # never reaches 0.35


def _with_mode(mode: str, accuracy: tuple[float, ...] = BELOW) -> list:
    events = _good_events(accuracy=accuracy)
    at = next(i for i, e in enumerate(events) if e[1] == "init_stop")
    events.insert(at, ("POINT_IN_TIME", "vflops_exponent", 5, {}))
    events.insert(at, ("POINT_IN_TIME", "loop_mode", mode, {}))
    return events


def test_fixed_epoch_run_below_target_is_compliant_and_scored_with_the_penalty(tmp_path: Path) -> None:
    path = _write_log(tmp_path / "fixed.txt", _with_mode("fixed_epochs"))
    analysis = analyse_log(str(path), "3.0.0")
    assert analysis.compliant, analysis.messages
    assert official_compliance(path, rules=RULES_FILE).returncode == 0
    log = parse_log(path)
    assert log.loop_mode == "fixed_epochs"
    minutes = (log.run_stop_ms - log.run_start_ms) / 60_000  # type: ignore[operator]
    score = fixed_epoch_score(
        log.benchmark, log.evals, log.flops_per_sample, log.train_samples, log.vflops_exponent, minutes
    )
    assert score is not None
    # 4.1e9 FLOPs/sample × 256 samples × 2 epochs over the log's run_start..run_stop seconds.
    seconds = minutes * 60
    assert score.flops == pytest.approx(4.1e9 * 256 * 2 / seconds)
    assert score.valid_flops == pytest.approx(score.flops * (0.28 / 0.35) ** 5)
    assert score.valid_flops == pytest.approx(score.flops * 0.32768)


def test_official_checker_passes_a_target_mode_run_that_logs_its_mode(tmp_path: Path) -> None:
    path = _write_log(tmp_path / "target.txt", _with_mode("target", (0.21, 0.38)))
    passed = official_compliance(path, rules=RULES_FILE)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert analyse_log(str(path), "3.0.0").compliant


def test_target_mode_run_below_target_still_fails(tmp_path: Path) -> None:
    for name, events in (("target", _with_mode("target")), ("none", _good_events(accuracy=BELOW))):
        path = _write_log(tmp_path / f"{name}.txt", events)
        analysis = analyse_log(str(path), "3.0.0")
        assert not analysis.compliant
        assert any("eval_accuracy" in m.text for m in analysis.messages), analysis.messages


def test_mode_changed_after_run_start_or_unknown_fails(tmp_path: Path) -> None:
    late = _good_events(accuracy=BELOW)
    at = next(i for i, e in enumerate(late) if e[1] == "eval_accuracy")
    late.insert(at, ("POINT_IN_TIME", "loop_mode", "fixed_epochs", {}))
    assert not analyse_log(str(_write_log(tmp_path / "late.txt", late)), "3.0.0").compliant
    bogus = _with_mode("whatever")
    assert not analyse_log(str(_write_log(tmp_path / "bogus.txt", bogus)), "3.0.0").compliant


def test_fixed_epoch_run_without_its_flops_fails(tmp_path: Path) -> None:
    events = [e for e in _with_mode("fixed_epochs") if e[1] != "flops_per_sample"]
    assert not analyse_log(str(_write_log(tmp_path / "noflops.txt", events)), "3.0.0").compliant


@settings(max_examples=200, deadline=None)
@given(
    flops=st.floats(0, 1e18),
    quality=st.floats(0, 1),
    target=st.floats(1e-3, 1),
    n=st.floats(0.5, 10),
)
def test_penalty_is_flops_times_quality_ratio_to_the_n(
    flops: float, quality: float, target: float, n: float
) -> None:
    value = valid_flops_penalty(flops, quality, target, n)
    assert value == pytest.approx(flops * (quality / target) ** n)
    assert value >= 0
    if quality <= target:
        assert value <= flops * (1 + 1e-12)  # below the target it is a penalty
    if quality == target:
        assert value == pytest.approx(flops)


@settings(max_examples=100, deadline=None)
@given(bad=st.sampled_from([math.nan, math.inf, -1.0, 0.0]))
def test_penalty_refuses_impossible_targets_and_exponents(bad: float) -> None:
    with pytest.raises(ValueError):
        valid_flops_penalty(1.0, 0.3, bad, 5)
    with pytest.raises(ValueError):
        valid_flops_penalty(1.0, 0.3, 0.35, bad)
    assert run_flops(1.0, 1.0, 1, bad) is None


# --- mlhpc check, report and variability on a folder of fixed-epoch runs ------------------

QUALITIES = (0.28, 0.30, 0.21, 0.33, 0.25)  # every run below the 0.35 target
ENTRY = ("Org", "results", "sysA", "strong", "extreme_weather")


def _expected_valid_flops(quality: float) -> float:
    # The synthetic log: events 1 s apart; 4.1e9 FLOPs/sample × 256 samples × 2 epochs.
    events = _with_mode("fixed_epochs", (0.21, quality))
    names = [e[1] for e in events]
    seconds = names.index("run_stop") - names.index("run_start")
    return 4.1e9 * 256 * 2 / seconds * (quality / 0.35) ** 5


def _fixed_epoch_org(root: Path, mode: str = "fixed_epochs") -> Path:
    folder = root.joinpath(*ENTRY)
    folder.mkdir(parents=True)
    for i, quality in enumerate(QUALITIES):
        events = _with_mode(mode, (0.21, quality))
        events = [(*e[:2], i + 1, e[3]) if e[1] == "seed" else e for e in events]
        _write_log(folder / f"result_{i}.txt", events)
    return root / "Org"


def test_check_scores_every_fixed_epoch_run_below_target(tmp_path: Path) -> None:
    from mlhpc.submission_checker import check_submission

    report = check_submission(_fixed_epoch_org(tmp_path))
    (entry,) = report.entries
    assert all(r.compliant and r.loop_mode == "fixed_epochs" for r in entry.runs)
    assert [r.valid_flops for r in entry.runs] == pytest.approx([_expected_valid_flops(q) for q in QUALITIES])
    assert entry.score_raw_min is not None  # scored (olympic mean of the times), none dropped
    assert entry.mean_flops() is not None
    assert entry.runs[0].to_json()["loop_mode"] == "fixed_epochs"


def test_check_still_fails_target_mode_runs_below_target(tmp_path: Path) -> None:
    from mlhpc.submission_checker import check_submission

    report = check_submission(_fixed_epoch_org(tmp_path, mode="target"))
    (entry,) = report.entries
    assert not any(r.compliant for r in entry.runs)
    assert entry.score_raw_min is None


def test_variability_reports_the_valid_flops_of_fixed_epoch_runs(tmp_path: Path) -> None:
    from mlhpc.results.variability import analyse, read_runs

    org = _fixed_epoch_org(tmp_path)
    (runs,) = read_runs(org).values()
    expected = sorted(_expected_valid_flops(q) for q in QUALITIES)
    assert sorted(r.valid_flops or 0.0 for r in runs) == pytest.approx(expected)
    result = analyse("x", runs, 0.05, 0.95)
    assert result.valid_flops is not None and result.valid_flops.mean == pytest.approx(sum(expected) / 5)


def test_report_gives_run_flops_over_run_time_and_the_valid_flops(tmp_path: Path) -> None:
    from mlhpc.common.training.timing import PHASES, Breakdown
    from mlhpc.results.report import read_breakdowns, report_csv

    _fixed_epoch_org(tmp_path)
    breakdown = Breakdown(
        seconds={p: 1.0 for p in PHASES},
        time_to_train_s=40.0,
        init_s=2.0,
        flops_per_sample=4.1e9,
        achieved_flops_per_s=9e10,
        train_samples_seen=512,
    )
    place = tmp_path / "breakdown" / "Org" / "sysA" / "strong" / "extreme_weather"
    place.mkdir(parents=True)
    (place / "result_1.json").write_text(json.dumps({"seed": 2, **breakdown.to_dict()}))
    (run,) = read_breakdowns(tmp_path)
    assert run.run_flops_per_s == pytest.approx(4.1e9 * 512 / 40.0)  # not over forward + backward
    assert run.valid_flops == pytest.approx(_expected_valid_flops(QUALITIES[1]))
    assert "valid_flops" in report_csv([run]).splitlines()[0]
