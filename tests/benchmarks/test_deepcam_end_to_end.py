"""`mlhpc run deepcam` end to end on the mini config: generate -> stage -> train to IoU 0.82 ->
MLLOG -> the official compliance checker -> `mlhpc check`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import mlhpc_cli
from tests.helpers.mllog_files import mllog_events, official_compliance

pytestmark = pytest.mark.slow

RESULT = "mlhpc/results/ci_cpu_n1/strong/deepcam/result_0.txt"


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("deepcam_mini_run")
    # No --division: mini runs go in the open division by default, since the closed rules fix
    # train_samples=121266 and eval_samples=15158, the real dataset's sizes (see the closed test below).
    args = ["run", "deepcam", "--config", "mini", "--seeds", "1", "--first-seed", "1"]
    args += ["--out", str(root / "out"), "--system", "ci_cpu_n1"]
    proc = mlhpc_cli(args, root, timeout=1200)
    return proc, root / "out"


def test_mini_run_reaches_the_iou_target(mini_run) -> None:
    proc, out = mini_run
    log = out / RESULT
    assert log.is_file(), proc.stderr
    events = mllog_events(log)
    ious = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert ious and ious[-1] >= 0.82
    assert ious[0] < 0.6  # it learned: an untrained net scores far below the target
    assert [e["metadata"]["status"] for e in events if e["key"] == "run_stop"] == ["success"]
    samples = {e["key"]: e["value"] for e in events if e["key"] in ("train_samples", "eval_samples")}
    assert samples == {"train_samples": 256, "eval_samples": 64}
    assert [e["value"] for e in events if e["key"] == "submission_division"] == ["open"]
    # One seed is not a submission: `mlhpc check` says so, and `run` says what it is (exit 0).
    assert "strong scaling needs exactly 5" in proc.stdout
    assert "1 of 5 runs: not yet a scoreable entry; run 4 more" in proc.stdout
    assert proc.returncode == 0, proc.stderr


def test_log_passes_the_official_compliance_checker(mini_run) -> None:
    _, out = mini_run
    result = official_compliance(out / RESULT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_closed_rules_fail_only_on_the_real_dataset_sizes(mini_run, tmp_path: Path) -> None:
    """The same log under the closed rules: every hyperparameter check passes; only the sample
    counts differ from the real dataset's."""
    _, out = mini_run
    text = (out / RESULT).read_text()
    closed = text.replace(
        '"key": "submission_division", "value": "open"', '"key": "submission_division", "value": "closed"'
    )
    assert closed != text
    path = tmp_path / "closed.txt"
    path.write_text(closed)
    result = official_compliance(path)
    output = result.stdout + result.stderr
    failed = sorted({line.split("'")[1] for line in output.splitlines() if "CHECK for '" in line})
    assert result.returncode == 1
    assert failed == ["eval_samples", "train_samples"], output
    assert "v['value'] == 121266" in output and "v['value'] == 15158" in output


def test_submission_holds_the_deepcam_hyperparameters(mini_run) -> None:
    _, out = mini_run
    keys = {e["key"]: e["value"] for e in mllog_events(out / RESULT)}
    assert keys["submission_benchmark"] == "deepcam"
    assert keys["opt_name"] == "LAMB" and keys["opt_max_grad_norm"] == 1.0
    assert keys["scheduler_type"] == "cosine_annealing" and keys["gradient_accumulation_frequency"] == 1
    impl = out / "mlhpc/benchmarks/deepcam/implementations/mlhpc-pytorch"
    assert "width_multiplier: 0.125" in (impl / "config.yaml").read_text()
    assert not list(out.rglob(".*.tmp"))
