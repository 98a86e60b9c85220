"""Run-to-run variability statistics on crafted logs with known answers, and on published ones."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from mlhpc.results.variability import (
    Spread,
    analyse,
    olympic_mean,
    olympic_se_factor,
    read_runs,
    runs_needed,
)
from tests.helpers.cli import mlhpc_cli
from tests.helpers.mllog_files import write_log

HELMHOLTZ = Path(__file__).parents[1] / "data/hpc_v2.0_helmholtzai/HelmholtzAI/results"

MINUTES = [10.0, 11.0, 12.0, 13.0, 14.0]
EPOCHS = [3, 4, 4, 5, 4]




@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    folder = tmp_path / "org/results/sys/strong/cosmoflow"
    for index, (minutes, epochs) in enumerate(zip(MINUTES, EPOCHS, strict=True)):
        write_log(folder / f"result_{index}.txt", 100 + index, minutes, epochs)
    write_log(folder / "result_5.txt", 105, 1.0, 1, status="aborted")  # not a finished run
    return tmp_path


def test_statistics_of_a_crafted_campaign(campaign: Path) -> None:
    ((entry, runs),) = read_runs(campaign).items()
    assert entry.name == "cosmoflow"
    assert sorted(r.seed for r in runs) == [100, 101, 102, 103, 104]  # the aborted run is left out
    result = analyse("cosmoflow", runs, difference=0.05, confidence=0.95)
    assert result.minutes.mean == pytest.approx(12.0)
    assert result.minutes.std == pytest.approx(math.sqrt(2.5))
    assert result.minutes.cv == pytest.approx(math.sqrt(2.5) / 12)
    assert result.epochs.mean == pytest.approx(4.0)
    assert result.epochs.std == pytest.approx(math.sqrt(0.5))
    assert result.olympic_minutes == pytest.approx(12.0)


def test_olympic_mean_drops_fastest_and_slowest() -> None:
    assert olympic_mean([5, 1, 100, 6, 7]) == pytest.approx(6.0)
    with pytest.raises(ValueError):
        olympic_mean([1, 2])


def test_olympic_standard_error_matches_known_values() -> None:
    # n = 3: the olympic mean is the median of three, whose variance is 0.4487 for unit normals.
    assert olympic_se_factor(3) ** 2 == pytest.approx(0.4487, rel=0.03)
    # Large n: trimming two of many barely matters, close to the plain mean's 1/sqrt(n).
    assert olympic_se_factor(60) == pytest.approx(1 / math.sqrt(60), rel=0.05)
    assert olympic_se_factor(5) > olympic_se_factor(10) > olympic_se_factor(20)


def test_runs_needed_is_the_smallest_sufficient_campaign() -> None:
    assert runs_needed(0.0, 0.05) == 3  # no noise: the minimum an olympic mean allows
    z = statistics.NormalDist().inv_cdf(0.975)
    for cv in (0.02, 0.05, 0.1):
        n = runs_needed(cv, 0.05, 0.95)
        assert n is not None
        assert z * math.sqrt(2) * cv * olympic_se_factor(n) <= 0.05
        if n > 3:
            assert z * math.sqrt(2) * cv * olympic_se_factor(n - 1) > 0.05
    assert runs_needed(0.05, 0.05) < runs_needed(0.1, 0.05)
    assert runs_needed(0.05, 0.05, 0.99) >= runs_needed(0.05, 0.05, 0.90)
    assert runs_needed(5.0, 0.01) is None


def test_spread_of_one_value_has_no_deviation() -> None:
    assert Spread.of([3.0]).std == 0.0


def test_command_on_published_logs_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "v.png"
    proc = mlhpc_cli(["variability", str(HELMHOLTZ), "--plot", str(png)], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "strong/cosmoflow: 10 successful runs" in proc.stdout, proc.stdout
    assert "strong/deepcam: 5 successful runs" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    groups = read_runs(HELMHOLTZ)
    cosmoflow = next(runs for path, runs in groups.items() if path.name == "cosmoflow")
    minutes = sorted(r.minutes for r in cosmoflow)
    # HelmholtzAI's published HoreKa n512 CosmoFlow score is the olympic mean: 5.494338 min.
    assert olympic_mean(minutes) == pytest.approx(5.494338, abs=1e-5)


def test_no_logs_is_a_one_line_error(tmp_path: Path) -> None:
    proc = mlhpc_cli(["variability", str(tmp_path)], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert str(tmp_path) in proc.stderr and proc.stderr.count("\n") == 1
