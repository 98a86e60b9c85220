"""Outputs over another campaign's records: each example of issue 39 refused in one line with
the record byte-identical; an option's own earlier output is still replaced (the control); the
check's JSON is strict (a one-run entry's undefined numbers are null), so mlhpc reads it back;
and the kind judge, by content, against random heads."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.common.safeio import safe_json
from mlhpc.common.safeio.writable import PNG_KIND, SQLITE_KIND, csv_kind, json_kind, page_kind

DATA = Path(__file__).parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
HOREKA = "horeka_gpu_n512_pytorch1.13"
DEEPCAM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "results" / HOREKA / "strong" / "deepcam"
SYSTEM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "systems" / f"{HOREKA}.json"
CAMPAIGN = b'{"submitter": "mlhpc", "ruleset": "3.0.0", "seeds": [1]}\n'


def one_run_entry(root: Path) -> Path:
    org = root / "hpc_results_v3.0" / "Org"
    entry = org / "results" / HOREKA / "strong" / "deepcam"
    entry.mkdir(parents=True)
    shutil.copyfile(DEEPCAM / "result_0.txt", entry / "result_0.txt")
    (org / "systems").mkdir()
    shutil.copyfile(SYSTEM, org / "systems" / SYSTEM.name)
    return org


def other_campaign(root: Path) -> Path:
    other = root / "OTHER"
    (other / "mlhpc" / "systems").mkdir(parents=True)
    (other / "campaign.json").write_bytes(CAMPAIGN)
    (other / "mlhpc" / "systems" / "sys.json").write_bytes(b'{"system_name": "sys"}\n')
    return other


def _refused(argv: list[str], record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = record.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a file this option wrote" in err, err
    assert record.read_bytes() == before


def test_check_json_over_another_campaigns_records_and_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    org, other = one_run_entry(tmp_path), other_campaign(tmp_path)
    for record in (other / "campaign.json", other / "mlhpc" / "systems" / "sys.json"):
        _refused(["check", str(org), "--json", str(record)], record, capsys)
    own = tmp_path / "score.json"
    main(["check", str(org), "--json", str(own)])
    first = own.read_text()
    assert "NaN" not in first and "Infinity" not in first
    data = safe_json.loads(first, dict)  # mlhpc's own reader: finite numbers only
    assert data["format"] == "mlhpc check"
    main(["check", str(org), "--json", str(own)])  # the control: its own output is replaced
    assert own.read_text() == first


def test_report_json_over_campaign_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    org, other = one_run_entry(tmp_path), other_campaign(tmp_path)
    _refused(["report", str(org), "--json", str(other / "campaign.json")], other / "campaign.json", capsys)


def test_dry_run_json_over_campaign_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = other_campaign(tmp_path)
    config = REPO / "benchmarks" / "cosmoflow" / "configs" / "mini.yaml"
    argv = ["run", "cosmoflow", "--config", str(config), "--out", str(tmp_path / "o"), "--dry-run"]
    _refused([*argv, "--json", str(other / "campaign.json")], other / "campaign.json", capsys)


def test_compare_report_over_its_own_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`results compare 1 --db site/index.html --report site`: the store would become a page."""
    site = tmp_path / "site"
    site.mkdir()
    db = site / "index.html"
    assert main(["results", "add", str(DATA / "hpc_v1.0_ncsa"), "--db", str(db)]) == 0
    capsys.readouterr()
    before = db.read_bytes()
    assert main(["results", "compare", "1", "--db", str(db), "--report", str(site)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "index.html" in err and "is the input" in err, err
    assert db.read_bytes() == before
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM entries").fetchone()[0] > 0


def test_results_add_db_over_a_page_or_a_campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = other_campaign(tmp_path)
    page = tmp_path / "index.html"
    page.write_text('<html><head><meta name="generator" content="mlhpc results compare"></head></html>')
    for record in (page, other / "campaign.json"):
        _refused(["results", "add", str(DATA / "hpc_v1.0_ncsa"), "--db", str(record)], record, capsys)


KINDS = [
    (json_kind("mlhpc check"), b'{\n  "format": "mlhpc check",'),
    (csv_kind("a,b", "t"), b"a,b\r\n"),
    (page_kind("mlhpc check"), b'<html><head><meta name="generator" content="mlhpc check">'),
    (PNG_KIND, b"\x89PNG\r\n\x1a\n"),
    (SQLITE_KIND, b"SQLite format 3\x00"),
]


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(KINDS) - 1), head=st.binary(max_size=200))
def test_a_kind_owns_a_file_only_by_its_signature(which: int, head: bytes) -> None:
    kind, signature = KINDS[which]
    assert kind.owns(signature + head) or which == 1  # a CSV's first line must be exactly the header
    if not head.startswith(signature[:4]) and signature[:4] not in head:
        assert not kind.owns(head)
    for other, other_signature in KINDS:
        if other is not kind:
            assert not kind.owns(other_signature), (kind.what, other.what)
    assert not kind.owns(CAMPAIGN) and not kind.owns(b':::MLLOG {"key": "run_start"}\n')


def test_the_json_kind_reads_json_not_text() -> None:
    kind = json_kind("mlhpc report")
    assert kind.owns(json.dumps({"format": "mlhpc report", "x": 1}).encode())
    assert not kind.owns(json.dumps({"x": 1, "format": "mlhpc report"}).encode())  # not first: not ours
    assert not kind.owns(b'{"format": "mlhpc report x"}')
