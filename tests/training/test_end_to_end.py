"""`mlhpc run` end to end on the mini config: generate -> stage -> train to target -> log -> check."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mlhpc.staging import build_manifest
from mlhpc.staging.manifest import MANIFEST_NAME
from tests.helpers.cli import mlhpc_cli
from tests.helpers.mllog_files import mllog_events, official_compliance

pytestmark = pytest.mark.slow

RESULT = "mlhpc/results/ci_cpu_n1/strong/cosmoflow/result_0.txt"


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("mini_run")
    args = [
        "run",
        "cosmoflow",
        "--config",
        "mini",
        "--seeds",
        "1",
        "--first-seed",
        "11",
        "--out",
        str(root / "out"),
        "--system",
        "ci_cpu_n1",
    ]
    proc = mlhpc_cli(args, root, timeout=900)
    return proc, root / "out"


def test_mini_run_reaches_target(mini_run) -> None:
    proc, out = mini_run
    log = out / RESULT
    assert log.is_file(), proc.stderr
    events = mllog_events(log)
    errors = [e["value"] for e in events if e["key"] == "eval_error"]
    assert errors and errors[-1] <= 0.124
    assert errors[0] > errors[-1]  # it learned
    stop = [e for e in events if e["key"] == "run_stop"]
    assert stop[0]["metadata"]["status"] == "success"
    # One seed is not a submission: the checker says so, and the run says what it is (exit 0).
    assert "strong scaling needs exactly 10" in proc.stdout
    assert "1 of 10 runs: not yet a scoreable entry; run 9 more with `mlhpc run cosmoflow" in proc.stdout
    assert "--seeds 10" in proc.stdout and proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("ruleset", ["3.0.0", "2.0.0"])
def test_log_passes_the_official_compliance_checker(mini_run, ruleset: str) -> None:
    _, out = mini_run
    result = official_compliance(out / RESULT, ruleset)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_staging_is_inside_the_timed_region(mini_run) -> None:
    _, out = mini_run
    keys = [e["key"] for e in mllog_events(out / RESULT)]
    order = [keys.index(k) for k in ("init_start", "init_stop", "run_start", "staging_start", "staging_stop")]
    assert order == sorted(order)
    assert keys.index("epoch_start") > keys.index("staging_stop")
    assert keys.count("run_stop") == 1
    for key in (
        "submission_org",
        "submission_platform",
        "cache_clear",
        "seed",
        "number_of_nodes",
        "accelerators_per_node",
        "global_batch_size",
        "train_samples",
        "eval_samples",
        "opt_base_learning_rate",
        "opt_learning_rate_warmup_epochs",
    ):
        assert key in keys, key


def test_submission_layout(mini_run) -> None:
    _, out = mini_run
    system = json.loads((out / "mlhpc/systems/ci_cpu_n1.json").read_text())
    assert system["system_name"] == "ci_cpu_n1" and system["number_of_nodes"] == "1"
    impl = out / "mlhpc/benchmarks/cosmoflow/implementations/mlhpc-pytorch"
    assert "loop:" in (impl / "config.yaml").read_text()
    assert not list(out.rglob(".*.tmp"))  # no half-written result file left behind


def test_earlier_results_are_never_overwritten(mini_run, run_mlhpc) -> None:
    _, out = mini_run
    before = (out / RESULT).read_bytes()
    proc = run_mlhpc(["run", "cosmoflow", "--seeds", "1", "--out", str(out), "--system", "ci_cpu_n1"])
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "already holds 1 result file(s); pass --resume to finish that campaign, a new --out" in proc.stderr
    assert (out / RESULT).read_bytes() == before


def test_non_finite_loss_aborts_with_a_well_formed_log(cosmo_data: Path, tmp_path: Path, run_mlhpc) -> None:
    import shutil

    data = tmp_path / "nan_data"
    shutil.copytree(cosmo_data, data)
    for label in (data / "train").glob("*_label.npy"):
        np.save(label, np.full(4, np.nan, dtype=np.float32))
    build_manifest(data).write(data / MANIFEST_NAME)
    out = tmp_path / "out"
    proc = run_mlhpc(
        [
            "run",
            "cosmoflow",
            "--seeds",
            "1",
            "--out",
            str(out),
            "--data",
            str(data),
            "--system",
            "ci_cpu_n1",
            "loop.global_batch_size=8",
        ]
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith("mlhpc: error: the run with seed")
        and "non-finite loss at epoch 1" in proc.stderr
    )
    assert proc.stderr.strip().count("\n") == 0
    log = out / RESULT
    events = mllog_events(log)
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    keys = [e["key"] for e in events]
    assert keys.count("epoch_start") == keys.count("epoch_stop") == 1
    # The official checker rejects it only for what an aborted run cannot have: an evaluation.
    result = official_compliance(log, "3.0.0")
    assert result.returncode == 1
    failures = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("Required")]
    assert failures and all("eval_" in line for line in failures), failures


def test_unknown_key_and_missing_data_are_one_line_errors(tmp_path: Path, run_mlhpc) -> None:
    proc = run_mlhpc(["run", "cosmoflow", "--out", str(tmp_path / "o"), "loop.max_epoch=3"])
    assert proc.returncode == 2 and "no config key 'loop.max_epoch'; did you mean loop.max_epochs" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    proc = run_mlhpc(["run", "cosmoflow", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "none")])
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
