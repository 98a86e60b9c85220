"""Names are data (issue 31): folder names holding terminal escapes, line breaks or bidi overrides
print as visible escapes through `mlhpc check`, `mlhpc results list|compare` and their HTML pages,
so no name can fake a "PASSED" line or reorder what a reviewer reads."""

from __future__ import annotations

import re
import shutil
import unicodedata
from pathlib import Path

import pytest

from tests.helpers.cli import mlhpc_cli

SAMPLE = Path(__file__).parents[1] / "data" / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
HOREKA = "horeka_gpu_n512_pytorch1.13"
DEEPCAM = SAMPLE / "results" / HOREKA / "strong" / "deepcam"
HOSTILE_SYSTEM = "sys\x1b[2K\rPASSED: 9 entries, 0 error(s)\n\u202eevil\x07"
HOSTILE_BENCHMARK = "deep\x1b[31mcam\u2066x"


def raw_controls(text: str) -> list[str]:
    """Every control, format or bidi character in `text` but the line ends a program prints."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


@pytest.fixture
def hostile_org(tmp_path: Path) -> Path:
    org = tmp_path / "Org\u202e"
    for system, benchmark in ((HOSTILE_SYSTEM, "deepcam"), (HOREKA, HOSTILE_BENCHMARK)):
        shutil.copytree(DEEPCAM, org / "results" / system / "strong" / benchmark)
        (org / "systems").mkdir(exist_ok=True)
        shutil.copyfile(SAMPLE / "systems" / f"{HOREKA}.json", org / "systems" / f"{system}.json")
    return org


def verdict_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"\s*(PASSED|FAILED)", line)]


def test_check_shows_hostile_names_as_escapes(hostile_org: Path, tmp_path: Path) -> None:
    proc = mlhpc_cli(
        ["check", str(hostile_org), "--ruleset", "2.0.0", "--report", str(tmp_path / "page")], tmp_path, 300
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert raw_controls(proc.stdout) == [] and raw_controls(proc.stderr) == []
    assert len(verdict_lines(proc.stdout)) == 1, "only the check's own verdict line"
    assert r"\x1b[2K\x0dPASSED" in proc.stdout and r"\u202e" in proc.stdout
    page = (tmp_path / "page" / "index.html").read_text(encoding="utf-8")
    assert raw_controls(page.replace("\n", "")) == []
    assert r"sys\x1b[2K\x0dPASSED" in page and r"deep\x1b[31mcam\u2066x" in page


def test_check_errors_start_with_mlhpc_and_escape_the_name(tmp_path: Path) -> None:
    missing = tmp_path / "no\x1b[2Ksuch\nfolder"
    proc = mlhpc_cli(["check", str(missing)], tmp_path, 120)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), proc.stderr
    assert raw_controls(proc.stderr) == [] and r"no\x1b[2Ksuch\x0afolder" in proc.stderr


def test_results_list_and_compare_show_hostile_names_as_escapes(hostile_org: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "store.sqlite")
    added = mlhpc_cli(["results", "add", str(hostile_org), "--db", db], tmp_path, 300)
    assert added.returncode == 0, added.stderr
    # Wide enough that no column is left out, however long this run's tmp path is.
    listed = mlhpc_cli(["results", "list", "--db", db], tmp_path, 120, COLUMNS="400")
    assert listed.returncode == 0, listed.stderr
    for proc in (added, listed):
        assert raw_controls(proc.stdout) == [] and raw_controls(proc.stderr) == []
        assert not verdict_lines(proc.stdout)
    assert r"\x1b[2K" in listed.stdout
    compared = mlhpc_cli(
        ["results", "compare", "1", "--all", "--db", db, "--report", str(tmp_path / "cmp")], tmp_path, 300
    )
    assert compared.returncode == 0, compared.stderr
    assert raw_controls(compared.stdout) == []
    page = (tmp_path / "cmp" / "index.html").read_text(encoding="utf-8")
    assert raw_controls(page.replace("\n", "")) == []
    missing = mlhpc_cli(["results", "compare", "x\x1b[2Ky", "--db", db], tmp_path, 120)
    assert missing.returncode == 2 and raw_controls(missing.stderr) == [], missing.stderr
