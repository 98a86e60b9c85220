"""The environment check (mlhpc/environment.py, `mlhpc doctor`, and `mlhpc run` before anything
is staged or recorded), attacked with a mismatched torch/torchvision pair made of a fake
torchvision package on PYTHONPATH: nothing is installed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from mlhpc.environment import EnvironmentProblem, check_device, pair_problem, torchvision_for
from tests.helpers.cli import mlhpc_cli
from tests.helpers.site_packages import fake_torchvision

NMS_ERROR = "operator torchvision::nms does not exist"


RAISES = f"raise RuntimeError({NMS_ERROR!r})\n"
THIS_PAIR = torchvision_for(torch.__version__) or "0.0.*"


@pytest.fixture
def wrong_pin(tmp_path: Path) -> Path:
    return fake_torchvision(tmp_path, "0.28.0", "torch==2.13.0", RAISES)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # One error line, the last (a slow step may say what it is doing before it).
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return errors[0]


@pytest.mark.parametrize(
    "args",
    [
        ["run", "deepcam", "--config", "mini", "--out", "out"],
        ["run", "extreme_weather", "--dry-run", "--out", "out"],
        ["doctor", "deepcam"],
    ],
)
def test_a_wrong_pin_is_one_line_before_anything_is_written(
    tmp_path: Path, wrong_pin: Path, args: list[str]
) -> None:
    line = one_line(mlhpc_cli(args, tmp_path, timeout=300, PYTHONPATH=str(wrong_pin)))
    assert "torchvision 0.28.0 is built for torch==2.13.0, but torch is" in line
    assert f"pip install 'torchvision=={THIS_PAIR}'" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "local").exists()


def test_a_broken_op_with_a_right_pin_is_one_line(tmp_path: Path) -> None:
    """The metadata agrees, the build does not: the import (or the first op) says so."""
    version = THIS_PAIR.replace("*", "0")
    site = fake_torchvision(tmp_path, version, f"torch>={torch.__version__.split('+')[0]}", RAISES)
    line = one_line(mlhpc_cli(["run", "deepcam", "--out", "out"], tmp_path, timeout=300, PYTHONPATH=str(site)))
    assert f"torchvision {version} does not work with torch" in line and NMS_ERROR in line
    assert not (tmp_path / "out").exists()


def test_cosmoflow_needs_no_torchvision(tmp_path: Path, wrong_pin: Path) -> None:
    proc = mlhpc_cli(["doctor", "cosmoflow", "--device", "cpu"], tmp_path, timeout=300, PYTHONPATH=str(wrong_pin))
    assert proc.returncode == 0 and "the environment is ready for cosmoflow" in proc.stdout, proc.stderr


def test_the_real_environment_is_ready() -> None:
    """The control case: this venv's own pair passes every check."""
    from mlhpc.environment import check_environment

    lines = check_environment(["deepcam", "extreme_weather"], None, "cpu")
    assert any(line.startswith("torchvision ") and "nms runs" in line for line in lines), lines


@pytest.mark.parametrize(
    ("torch_version", "vision", "requires", "bad"),
    [
        ("2.14.1+cu130", "0.29.1+cu130", ["torch (>=2.14.0)"], False),
        ("2.9.0", "0.24.0", ["numpy", "torch==2.9.0"], False),
        ("2.13.0+cpu", "0.28.0", ["torch==2.13.0"], False),
        ("2.14.0", "0.28.0", ["torch==2.13.0"], True),  # the pin
        ("2.15.0", "0.29.1", ["torch (>=2.14.0)"], True),  # the pin allows it, the series does not
        ("2.14.0", "0.29.0", ["torch==2.14.0 ; extra == 'x'"], False),  # a marker: not the pin
    ],
)
def test_pair_rule(torch_version: str, vision: str, requires: list[str], bad: bool) -> None:
    problem = pair_problem(torch_version, vision, requires)
    assert (problem is not None) == bad, problem
    if bad:
        assert f"pip install 'torchvision=={torchvision_for(torch_version)}'" in problem


def test_cuda_asked_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EnvironmentProblem, match=r"--device cuda, but torch .* sees no GPU.*--device cpu"):
        check_device("cuda")
    assert check_device("auto") == "device: cpu"
