"""The results store proves its schema before any read or write: a planted trigger, view, table
or index is refused in one line and never runs; an id from outside (a non-ASCII digit, 20 or 5000
digits) is one line, not a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlhpc.cli import main

DATA = Path(__file__).parents[1] / "data"
NCSA = DATA / "hpc_v1.0_ncsa"


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("store") / "store.sqlite"
    assert main(["results", "add", str(NCSA), "--db", str(db)]) == 0
    return db


def _rows(db: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT * FROM entries ORDER BY id").fetchall()


PLANTS = {
    "trigger": "CREATE TRIGGER wipe AFTER INSERT ON entries BEGIN DELETE FROM entries WHERE id != NEW.id; END",
    "view": "CREATE VIEW v AS SELECT * FROM entries",
    "table": "CREATE TABLE extra (x)",
    "index": "CREATE INDEX extra_ix ON entries(system)",
    "dropped index": "DROP INDEX entries_by_benchmark",
    "changed table": "ALTER TABLE runs ADD COLUMN planted TEXT",
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_object_is_refused_before_it_runs(
    plant: str, clean_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "store.sqlite"
    db.write_bytes(clean_store.read_bytes())
    with sqlite3.connect(db) as connection:
        connection.execute(PLANTS[plant])
    before = _rows(db)
    capsys.readouterr()
    for argv in (["results", "add", str(NCSA)], ["results", "list"], ["results", "compare", "1"]):
        assert main([*argv, "--db", str(db)]) == 2, (plant, argv)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a results store as mlhpc makes it" in err, err
    assert _rows(db) == before  # the trigger never ran, nothing was replaced


def test_the_control_the_clean_store_is_read(clean_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", "list", "--db", str(clean_store)]) == 0


NAMES = st.sampled_from(["trigger", "view", "table", "index"])
IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=NAMES, name=IDENT)
def test_any_extra_object_is_refused(
    kind: str, name: str, clean_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = tmp_path_factory.mktemp("plant") / "store.sqlite"
    db.write_bytes(clean_store.read_bytes())
    sql = {
        "trigger": f"CREATE TRIGGER t_{name} BEFORE INSERT ON runs BEGIN SELECT 1; END",
        "view": f"CREATE VIEW v_{name} AS SELECT 1",
        "table": f"CREATE TABLE t_{name} (x)",
        "index": f"CREATE INDEX i_{name} ON runs(file)",
    }[kind]
    with sqlite3.connect(db) as connection:
        connection.execute(sql)
    assert main(["results", "list", "--db", str(db)]) == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.one_of(
        st.text(max_size=30),
        st.integers(min_value=2**63 - 10, max_value=10**4000).map(str),  # str() stops at 4300 digits
        st.sampled_from(["²", "١٢", "9" * 20, "9" * 5000, "0" * 30 + "1"]),
    )
)
@example(name="-:")  # found by hypothesis: an id that starts with "-" reads as an option
def test_an_id_from_outside_is_one_line(
    name: str, clean_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()  # an earlier example's output is not this one's
    try:
        code = main(["results", "compare", name, "--db", str(clean_store)])
    except SystemExit as stop:  # argparse's own one-line error, as the shell would see it
        code = stop.code
    captured = capsys.readouterr()
    if code != 0:
        assert code == 2 and captured.err.count("\n") == 1, captured.err
        assert "Traceback" not in captured.err
