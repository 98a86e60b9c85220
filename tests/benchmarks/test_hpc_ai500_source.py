"""HPC AI500's target is stored once (the rule file the official checker enforces), and a run logs
the Valid FLOPS the checker computes from the same log (FLOPS over run_start..run_stop)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mlhpc.benchmarks.extreme_weather import train
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.contract import catalog, registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError
from mlhpc.common.training.loop import RunResult
from mlhpc.submission_checker import hpc_ai500
from mlhpc.submission_checker.logparse import parse_log
from mlhpc.submission_checker.scoring import fixed_epoch_score, log_fixed_epoch_score
from tests.helpers.mllog_files import RULES_FILE, _good_events, _write_log, official_compliance
from tests.helpers.toy_benchmark import run_toy

TARGET = hpc_ai500.target("extreme_weather")


# --- one source: the rule file ---------------------------------------------------------------
def test_the_target_read_from_the_rule_file_is_the_one_the_official_checker_enforces(
    tmp_path: Path,
) -> None:
    assert TARGET is not None and 0 < TARGET < 1
    at = _write_log(tmp_path / "at.txt", _good_events(accuracy=(0.21, TARGET)))
    below = _write_log(tmp_path / "below.txt", _good_events(accuracy=(0.21, TARGET - 1e-4)))
    passed = official_compliance(at, rules=RULES_FILE)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    failed = official_compliance(below, rules=RULES_FILE)
    assert failed.returncode == 1 and "Failed checks for eval_accuracy" in failed.stderr


def test_every_extreme_weather_config_trains_to_the_rule_files_target() -> None:
    bench = registry.get("extreme_weather")
    for name in ("full", "mini"):
        assert load_config(bench.config_class, bench.config_path(name), []).loop.target == TARGET, name


def test_the_checker_scores_with_the_rule_files_target() -> None:
    evals = (("eval_accuracy", 1.0, 0.2), ("eval_accuracy", 2.0, 0.28))
    score = fixed_epoch_score("extreme_weather", evals, 4.1e9, 256, 5.0, 1.0)
    assert score is not None and TARGET is not None
    assert score.valid_flops == pytest.approx(4.1e9 * 256 * 2 / 60.0 * (0.28 / TARGET) ** 5)
    assert fixed_epoch_score("cosmoflow", evals, 4.1e9, 256, 5.0, 1.0) is None  # not HPC AI500


def test_rule_target_follows_the_file_and_refuses_none_or_two(tmp_path: Path) -> None:
    text = RULES_FILE.read_text(encoding="utf-8")
    check = "v['value'] >= 0.35"
    assert text.count(check) == 1  # the one number every edit below replaces
    moved = tmp_path / "moved.yaml"
    moved.write_text(text.replace(check, "v['value'] >= 0.4"), encoding="utf-8")
    assert hpc_ai500.rule_target(moved, "eval_accuracy") == 0.4
    none = tmp_path / "none.yaml"
    none.write_text(text.replace(check, "v['value'] > 0."), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"none.yaml: the eval_accuracy rule holds no"):
        hpc_ai500.rule_target(none, "eval_accuracy")
    two = tmp_path / "two.yaml"
    two.write_text(text.replace(check, "v['value'] >= 0.35 and v['value'] >= 0.5"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[0.35, 0.5\]"):
        hpc_ai500.rule_target(two, "eval_accuracy")
    assert hpc_ai500.target("cosmoflow") is None and hpc_ai500.target(None) is None


def test_the_catalog_names_the_rule_file_the_target_comes_from() -> None:
    info = catalog.info("extreme_weather")
    assert info.rules_file is not None
    assert hpc_ai500.rule_target(info.rules_file, info.target.metric) == TARGET


# --- the run's own Valid FLOPS ----------------------------------------------------------------
def _result(metrics: list[float], **fields: float) -> RunResult:
    values = {"flops_per_sample": 5e9, "achieved_flops_per_s": 2e10, "train_samples": 256, **fields}
    return RunResult(
        status="success", epochs=2, metrics=metrics, run_seconds=10.0, train_samples_per_s=3.0, **values
    )


def test_run_end_events_score_flops_over_the_run_time_not_the_compute_time() -> None:
    cfg = load_config(train.ExtremeWeatherConfig, registry.get("extreme_weather").config_path("mini"), [])
    events = train.run_end_events(cfg, _result([0.2, 0.42]))
    run_flops = 5e9 * 256 * 2 / 10.0  # FLOPs per sample x samples an epoch x epochs / run seconds
    assert events == {
        "flops_per_sample": 5e9,
        "achieved_flops_per_s": 2e10,
        "valid_flops": pytest.approx(run_flops * (0.42 / 0.35) ** 5),
    }
    aborted = train.run_end_events(cfg, _result([0.2, math.nan]))
    assert aborted["valid_flops"] == 0.0  # a NaN quality scores nothing (and logs a number)


@pytest.mark.slow
def test_a_fixed_epoch_run_logs_the_valid_flops_the_checker_computes(tmp_path: Path) -> None:
    bench = registry.get("extreme_weather")
    # Half the mini's 64 evaluation snapshots: the run needs a quality above 0, not a precise one.
    overrides = ["loop.mode=fixed_epochs", "loop.max_epochs=3", "data.num_eval_samples=32"]
    cfg = load_config(bench.config_class, bench.config_path("mini"), overrides)
    data = bench.generate(cfg, tmp_path / "data")
    log_path = tmp_path / "result_0.txt"
    result = run_toy(cfg, init_distributed("auto", "cpu"), log_path, seed=5, bench=bench, data_dir=data)
    assert result.status == "success" and result.epochs == 3
    log = parse_log(log_path)
    score = log_fixed_epoch_score(log)
    assert score is not None and log.valid_flops is not None and score.quality > 0, result.metrics
    # run_end_events is logged a moment before run_stop: equal up to that moment and ms rounding.
    assert log.valid_flops == pytest.approx(score.valid_flops, rel=2e-3)
    # Over the run's time (loading, evaluation in), below the forward + backward FLOP/s.
    assert log.achieved_flops_per_s is not None and score.flops < log.achieved_flops_per_s
