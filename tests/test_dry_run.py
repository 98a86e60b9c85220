"""`mlhpc run ... --dry-run`: the config (and the data) checked, the init events printed, nothing
built or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import mlhpc_cli


def events(stdout: str) -> dict[str, object]:
    lines = [json.loads(line.split(":::MLLOG", 1)[1]) for line in stdout.splitlines() if ":::MLLOG" in line]
    return {e["key"]: e["value"] for e in lines}


def test_dry_run_prints_the_rcp_hyperparameters_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = mlhpc_cli(["run", "cosmoflow", "--config", "rcp_512", "--out", str(out), "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    logged = events(proc.stdout)
    assert logged["global_batch_size"] == 512
    assert logged["opt_base_learning_rate"] == 0.006 and logged["opt_learning_rate_warmup_factor"] == 4.0
    assert logged["opt_learning_rate_decay_factor"] == [0.5, 0.25, 0.125, 0.0625]
    keys = list(logged)
    assert keys.index("init_start") < keys.index("seed") < keys.index("init_stop")
    assert "run_start" not in logged
    assert "Nothing was built" in proc.stdout
    assert not out.exists() and not (tmp_path / "local").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["loop.max_epoch=3"], "loop.max_epoch"),  # a typo in an override
        (["--config", "rcp_77"], "rcp_77"),
        (["--instances", "2"], "--instances 2 does not divide"),
        (["--staging", "before", "--ruleset", "2.0.0"], "--staging before is not allowed"),
        (["loop.global_batch_size=3", "loop.gradient_accumulation_steps=2"], "not divisible"),
    ],
)
def test_dry_run_refuses_a_run_that_would_fail(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--dry-run", *extra], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dry_run_checks_the_data_it_is_given(tmp_path: Path) -> None:
    data = tmp_path / "not_a_dataset"
    data.mkdir()
    (data / "train").mkdir()
    proc = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--data", str(data), "--dry-run"], tmp_path
    )
    assert proc.returncode != 0
    assert str(data) in proc.stderr and "Traceback" not in proc.stderr
