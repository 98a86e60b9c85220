"""A results store changed by hand, and hostile JSON in a submission: one line or one finding
naming the file and the fix, never a traceback (issue 31)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.submission_checker import check_submission

DATA = Path(__file__).parents[1] / "data"
NCSA = DATA / "hpc_v1.0_ncsa"
SAMPLE = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI"

# What a hand edit can put in a column: SQLite keeps any type anywhere, `1e400` as infinity.
TAMPERED = st.one_of(
    st.sampled_from(["1e400", "-1e400", "-1", "9e18", "'x'", "'1e400'", "X'00ff'", "'[[[[[[[[1]]]]]]]]'"]),
    st.sampled_from(["NULL", "''", "'\x1b[2K\rPASSED'", "1.5", "0"]),
)
COLUMNS = ["score_min", "accelerators", "nodes", "runs", "energy_j", "system", "origin", "scaling", "epochs"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("store") / "store.sqlite"
    assert main(["results", "add", str(NCSA), "--db", str(db)]) == 0
    return db


def one_captured_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), err
    return lines[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(COLUMNS), value=TAMPERED)
def test_a_hand_edited_store_is_one_line_or_a_clean_listing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: str
) -> None:
    db = tmp_path / "edited.sqlite"
    shutil.copyfile(store, db)
    try:
        with sqlite3.connect(db) as connection:
            connection.execute(f"UPDATE entries SET {column} = {value} WHERE id = 1")
    except sqlite3.IntegrityError:
        return  # a NOT NULL column refuses it: nothing to read back
    capsys.readouterr()
    for args in (["list"], ["compare", "1", "--all"]):
        status = main(["results", *args, "--db", str(db)])
        if status == 2:
            line = one_captured_error_line(capsys)
            assert str(db) in line and "move" in line and column in line
        else:
            assert status == 0
            out = capsys.readouterr().out
            assert "\x1b" not in out and "\r" not in out  # text columns keep 1e400 as the text "Inf"


def test_infinity_in_a_store_is_refused_by_name(store: Path, tmp_path: Path, capsys) -> None:
    db = tmp_path / "edited.sqlite"
    shutil.copyfile(store, db)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE entries SET score_min = 1e400 WHERE id = 1")
    capsys.readouterr()
    assert main(["results", "list", "--db", str(db)]) == 2
    line = one_captured_error_line(capsys)
    assert f"results store {db}: entry 1's score_min is inf" in line and "add again" in line


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"system_name": 1e400, "number_of_nodes": "1"}',
        '{"a": NaN}',
        '{"a": ' + "[" * 70 + "]" * 70 + "}",
        "[1, 2]",
    ],
)
def test_hostile_systems_json_is_one_finding(tmp_path: Path, text: str) -> None:
    org = tmp_path / "Org"
    shutil.copytree(SAMPLE, org)
    victim = next((org / "systems").glob("*.json"))
    victim.write_text(text)
    report = check_submission(org, ruleset="2.0.0")
    found = [f for f in report.findings if f.path == f"systems/{victim.name}"]
    assert len(found) == 1 and found[0].rule == "system-json" and found[0].severity == "error", found
    assert found[0].fix


def test_hostile_scaling_json_is_one_warning(tmp_path: Path) -> None:
    org = tmp_path / "Org"
    shutil.copytree(SAMPLE, org)
    entry = next((org / "results").glob("*/strong/deepcam"))
    for text in ('{"scaling_factor": 1e400}', "[" * 3000 + "]" * 3000):
        (entry / "scaling.json").write_text(text)
        (e,) = [
            x
            for x in check_submission(org, ruleset="2.0.0").entries
            if x.benchmark == "deepcam"
            and Path(x.runs[0].file).parent.name == "deepcam"
            and entry.parent.parent.name == x.system
        ]
        assert [f.rule for f in e.findings if f.rule == "scaling-json"] == ["scaling-json"]
