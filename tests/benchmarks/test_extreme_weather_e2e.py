"""`mlhpc run extreme_weather` on mini: generate -> stage -> train to mAP 0.35 -> log -> check with our rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlhpc.common.contract import catalog
from mlhpc.submission_checker.logparse import parse_log
from mlhpc.submission_checker.scoring import fixed_epoch_score
from tests.helpers.cli import mlhpc_cli
from tests.helpers.mllog_files import mllog_events, official_compliance

RULES_FILE = catalog.info("extreme_weather").rules_file
assert RULES_FILE is not None

pytestmark = pytest.mark.slow

RESULT = "mlhpc/results/ci_cpu_n1/strong/extreme_weather/result_0.txt"


def test_mini_run_reaches_target_and_passes_the_rules(tmp_path: Path) -> None:
    args = ["run", "extreme_weather", "--config", "mini", "--seeds", "1", "--first-seed", "1"]
    args += ["--out", str(tmp_path / "out"), "--system", "ci_cpu_n1"]
    proc = mlhpc_cli(args, tmp_path, timeout=900)
    log = tmp_path / "out" / RESULT
    assert log.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    events = mllog_events(log)
    values = {e["key"]: e["value"] for e in events}
    maps = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert maps and maps[-1] >= 0.35, maps
    assert len(maps) >= 2 and maps[0] < maps[-1], maps  # it learned over epochs, not by epoch 1
    assert next(e for e in events if e["key"] == "run_stop")["metadata"]["status"] == "success"
    # The run-end events sit just before run_stop; Valid FLOPS is what the checker computes from
    # the same log (FLOPS over run_start..run_stop), up to the moment between the two lines.
    keys = [e["key"] for e in events]
    assert keys[-4:] == ["flops_per_sample", "achieved_flops_per_s", "valid_flops", "run_stop"]
    assert values["flops_per_sample"] > 1e8 and values["achieved_flops_per_s"] > 0
    parsed = parse_log(log)
    minutes = (parsed.run_stop_ms - parsed.run_start_ms) / 60_000  # type: ignore[operator]
    score = fixed_epoch_score(
        parsed.benchmark, parsed.evals, parsed.flops_per_sample, parsed.train_samples, 5.0, minutes
    )
    assert score is not None and values["valid_flops"] == pytest.approx(score.valid_flops, rel=2e-3)
    official = official_compliance(log, rules=RULES_FILE)
    assert official.returncode == 0, official.stdout + official.stderr
    # `mlhpc run` ends with `mlhpc check`: it reports the HPC AI500 figures (one run: too few for a score).
    assert "ci_cpu_n1/strong/extreme_weather: achieved" in proc.stdout and "Valid FLOPS" in proc.stdout
