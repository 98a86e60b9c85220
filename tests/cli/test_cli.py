"""The command line: version, help with an example on every command, check on a real submission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlhpc import __version__
from mlhpc.cli import main
from mlhpc.common.training.mllogger import MLLog

SAMPLE = Path(__file__).parents[1] / "data" / "hpc_v2.0_helmholtzai" / "HelmholtzAI"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mlhpc {__version__}"


@pytest.mark.parametrize("command", [[], ["generate"], ["stage"], ["run"], ["check"]])
def test_help_has_an_example(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "example:" in capsys.readouterr().out


def test_check_scores_the_real_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    assert main(["check", str(SAMPLE), "--ruleset", "2.0.0", "--json", str(report)]) == 0
    entries = json.loads(report.read_text())["entries"]
    scores = {(e["system"], e["benchmark"]): e["score_raw_min"] for e in entries}
    assert scores[("horeka_gpu_n512_pytorch1.13", "cosmoflow")] == pytest.approx(5.494338, abs=1e-6)
    assert "cosmoflow" in capsys.readouterr().out


def test_generate_then_stage_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, local = tmp_path / "data", tmp_path / "local"
    assert main(["generate", "cosmoflow", "--out", str(data), "--samples", "8"]) == 0
    assert main(["stage", str(data), str(local)]) == 0
    assert main(["stage", str(data), str(local), "--verify"]) == 0
    assert "files verified" in capsys.readouterr().out
    victim = next((local / "train").glob("*_label.npy"))
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    assert main(["stage", str(data), str(local), "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlhpc: error: staged file") and victim.name in err


def test_unknown_benchmark_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "cosmo", "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == "mlhpc: error: no benchmark 'cosmo'; known: aiperf, cosmoflow, deepcam, extreme_weather\n"
    )


def test_mllog_only_rank_zero_writes_and_files_appear_whole(tmp_path: Path) -> None:
    quiet = MLLog(tmp_path / "rank1.txt", enabled=False)
    quiet.event("seed", 1)
    assert quiet.close() is None and not list(tmp_path.iterdir())
    log = MLLog(tmp_path / "result_0.txt", enabled=True, echo=False)
    log.start("init_start")
    assert not (tmp_path / "result_0.txt").exists()  # still under its temporary name
    log.event("seed", 7, {"epoch_num": 1})
    assert log.close() == tmp_path / "result_0.txt"
    lines = (tmp_path / "result_0.txt").read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith(":::MLLOG {") for line in lines)
    assert json.loads(lines[1].split(":::MLLOG", 1)[1])["value"] == 7
