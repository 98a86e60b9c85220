"""What `mlhpc check` prints and writes: the table, --json, --csv, --report, exit codes."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from mlhpc.cli import main
from mlhpc.submission_checker import check_command, check_submission
from mlhpc.submission_checker.export import COLUMNS, report_csv
from mlhpc.submission_checker.html_report import convergence_target, report_html

DATA = Path(__file__).parents[1] / "data"
V2 = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
V3 = DATA / "hpc_v3.0_openfold"


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def v2_report():
    return check_submission(V2, ruleset="2.0.0")


def test_csv_has_one_row_per_entry_with_exact_scores(v2_report) -> None:
    rows = list(csv.DictReader(io.StringIO(report_csv(v2_report))))
    assert tuple(rows[0]) == COLUMNS
    oc20 = next(r for r in rows if r["system"] == "juwelsbooster_gpu_n512_pytorch1.13")
    assert float(oc20["score_raw_min"]) == 38.167550000000006
    assert float(oc20["score_min"]) == 38.80695483247423
    assert (oc20["rcp_verdict"], oc20["rcp_message"], oc20["ruleset"]) == ("pass", "RCP found", "2.0.0")
    cosmoflow = next(r for r in rows if r["benchmark"] == "cosmoflow")
    assert (cosmoflow["rcp_verdict"], cosmoflow["errors"], cosmoflow["warnings"]) == ("fail", "0", "3")


def test_convergence_target_comes_from_the_rules() -> None:
    assert convergence_target("2.0.0", "cosmoflow") == ("eval_error", "<=", 0.124)
    assert convergence_target("3.0.0", "openfold") == ("eval_accuracy", ">=", 0.8)
    assert convergence_target("2.0.0", "openfold") is None


def test_html_report_is_self_contained_and_marks_what_it_should(v2_report) -> None:
    page = report_html(v2_report)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script|src=|href=\"http", page)  # nothing to fetch or run
    sections = page.split("<section")[1:]
    assert len(sections) == len(v2_report.entries)
    oc20 = next(s for s in sections if "juwelsbooster_gpu_n512_pytorch1.13 / strong / oc20" in s)
    assert oc20.count("<polyline") == 5  # one convergence curve per run
    assert "target eval_error &lt;= 0.036" in oc20
    assert oc20.count('class="dropped"') == 2  # the fastest and the slowest run
    assert "dropped (fastest)" in oc20 and "dropped (slowest)" in oc20
    assert "RCP mean" in oc20 and "38.806955" in oc20
    cosmoflow = next(s for s in sections if "/ cosmoflow" in s)
    assert "RCP: <b>fail</b>" in cosmoflow and "rcp-bypass" in cosmoflow


def test_command_writes_json_csv_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = digest(V3)
    out = tmp_path / "out"
    code = check_command(V3, json_path=out / "r.json", csv_path=out / "r.csv", report_dir=out / "html")
    assert code == 0
    assert digest(V3) == before
    printed = " ".join(capsys.readouterr().out.split())  # as wrapped at any width (tmp paths differ)
    assert "ruleset 3.0.0, the folder name 'v3.0' decided" in printed
    assert "pass ×1.0231" in printed and "263.520317" in printed
    data = json.loads((out / "r.json").read_text())
    assert data["ruleset"] == "3.0.0"
    assert {e["rcp"]["verdict"] for e in data["entries"]} == {"pass", "fail"}
    assert (out / "html" / "index.html").read_text().count("<section") == 2
    assert len((out / "r.csv").read_text().splitlines()) == 3


def test_command_refuses_to_write_into_the_submission(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    org = tmp_path / "HelmholtzAI"
    shutil.copytree(V2, org)
    before = digest(org)
    assert check_command(org, report_dir=org / "report") == 2
    assert "is inside the input" in capsys.readouterr().err  # the one output guard (writable.py)
    assert digest(org) == before


def test_command_line_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path, report = tmp_path / "s.csv", tmp_path / "rep"
    assert main(["check", str(V2), "--csv", str(csv_path), "--report", str(report)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as wrapped at any width (tmp paths differ)
    assert "ruleset 2.0.0, the folder name 'v2.0' decided" in out
    assert csv_path.is_file() and (report / "index.html").is_file()
    assert main(["check", str(tmp_path / "nothing")]) == 2
    with pytest.raises(SystemExit):
        main(["check", str(V2), "--ruleset", "9.9.9"])
