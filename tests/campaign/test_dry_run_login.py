"""A dry run works on a login node: every full and rcp_<batch> config of every benchmark gives
what will train (`--json` with the LR per epoch) without --data and without free space, and
exits 0; what it does touch (the config: a batch larger than the data) it refuses, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlhpc.cli import main
from mlhpc.common.contract import catalog

CONFIGS = [
    (name, path.stem)
    for name in ("cosmoflow", "deepcam", "extreme_weather")
    for path in sorted(catalog.info(name).configs_dir.glob("*.yaml"))
    if path.stem == "full" or path.stem.startswith("rcp_")
]


def test_every_full_and_rcp_config_is_listed() -> None:
    assert len([c for c in CONFIGS if c[1].startswith("rcp_")]) >= 10 and len(CONFIGS) >= 13, CONFIGS


@pytest.fixture
def no_free_space(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every folder has 1 MB free (the size check's one free-space function)."""
    monkeypatch.setattr("mlhpc.generation.free_bytes", lambda target: (Path(target), 1 << 20))


@pytest.mark.parametrize(("benchmark", "config"), CONFIGS)
def test_dry_run_json_without_data_or_space(
    tmp_path: Path, no_free_space: None, capsys: pytest.CaptureFixture[str], benchmark: str, config: str
) -> None:
    out, where = tmp_path / "out", tmp_path / "view.json"
    args = ["run", benchmark, "--config", config, "--out", str(out), "--dry-run", "--json", str(where)]
    status = main([*args, "--device", "cpu"])
    text = capsys.readouterr()
    assert status == 0, text.err
    view = json.loads(where.read_text())
    lrs = view["lr_per_epoch"]
    assert view["benchmark"] == benchmark and lrs is not None
    assert len(lrs) == view["config"]["loop"]["max_epochs"] and all(lr >= 0 for lr in lrs)
    estimate = view["epoch_minutes_estimate"]
    if benchmark != "extreme_weather":  # docs/DATASETS.md has published throughput for the two
        samples = view["config"]["data"]["num_train_samples"]
        assert estimate["A100"] == pytest.approx(
            samples / (1 * {"cosmoflow": 90.7, "deepcam": 21.3}[benchmark]) / 60
        )
        assert "time per epoch, estimated" in text.out
    # What the size check would refuse is said, not refused; and nothing went into --out.
    assert "a run without --data here would refuse" in text.out and "free" in text.out
    assert not out.exists()


def test_the_real_run_refuses_no_space_where_the_dry_run_says_it(
    tmp_path: Path, no_free_space: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control case: the same check still refuses a real run, before --out is made."""
    out = tmp_path / "out"
    assert main(["run", "cosmoflow", "--config", "full", "--out", str(out)]) == 2
    assert "needs about" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_batch_larger_than_the_data_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: bool
) -> None:
    out = tmp_path / "out"
    args = ["run", "cosmoflow", "--config", "mini", "--out", str(out), "loop.global_batch_size=2048"]
    assert main([*args, *(["--dry-run"] if dry_run else [])]) == 2
    err = capsys.readouterr().err
    assert "loop.global_batch_size=2048 is more than data.num_train_samples=1024" in err, err
    errors = [line for line in err.splitlines() if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0] and not out.exists(), err


@pytest.mark.parametrize(
    ("overrides", "verdict"), [([], "matches"), (["data.num_train_samples=64"], "DIFFERS")]
)
def test_the_dry_run_says_whether_data_matches_the_config(
    tmp_path: Path, cosmo_data: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], verdict: str
) -> None:
    """cosmo_data holds 32 training samples; the closed division's CosmoFlow has 524,288."""
    args = ["run", "cosmoflow", "--out", str(tmp_path / "out"), "--data", str(cosmo_data), "--dry-run"]
    assert main([*args, "data.num_train_samples=32", "data.num_eval_samples=8", *overrides]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("--data "))
    assert f"holds 32 training samples: {verdict}" in line and "closed division's dataset has 524,288" in line
