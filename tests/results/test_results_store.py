"""The results store: `mlhpc results add|list|compare` on real published entries (tests/data)."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.submission_checker import check_submission
from tests.helpers.cli import cli_env, mlhpc_cli, said_lines
from tests.helpers.processes import held_by_another_process

DATA = Path(__file__).parents[1] / "data"
HELMHOLTZ = DATA / "hpc_v2.0_helmholtzai"
NCSA = DATA / "hpc_v1.0_ncsa"
WEAK = DATA / "hpc_v3.0_weak"


def _rows(db: Path, query: str, *args: object) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(query, args).fetchall()


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = said_lines(err.strip())
    assert len(lines) == 1, err
    return lines[0]


def test_add_stores_what_the_check_computes(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(HELMHOLTZ), str(WEAK), "--db", str(db)]) == 0
    checks = [check_submission(HELMHOLTZ), check_submission(WEAK)]
    expected = {
        (e.submitter, e.system, e.scaling, e.benchmark): (e.score_min, e.models_per_min, len(e.runs))
        for report in checks
        for e in report.entries
    }
    stored = {
        tuple(row[:4]): tuple(row[4:])
        for row in _rows(
            db,
            "SELECT submitter, system, scaling, benchmark, score_min, models_per_min, runs FROM entries",
        )
    }
    assert stored == expected  # exact floats: the store keeps the check's scores as they are
    origins = {row[0] for row in _rows(db, "SELECT DISTINCT origin FROM entries")}
    assert origins == {"published"}  # both folders are named for a round
    run_count = sum(len(e.runs) + len(e.pruned_runs) for report in checks for e in report.entries)
    assert _rows(db, "SELECT count(*) FROM runs")[0][0] == run_count

    # HelmholtzAI's horeka deepcam: 128 nodes × 4 GPUs, tracked_stats ~9,660 samples/s, 81 s staging
    (acc, nodes, per_acc, staging_s, share, epochs, verdict) = _rows(
        db,
        "SELECT accelerators, nodes, samples_per_s_per_accelerator, staging_s, staging_share, epochs, "
        "rcp_verdict FROM entries WHERE system LIKE 'horeka_gpu_n512%' AND benchmark = 'deepcam'",
    )[0]
    assert (acc, nodes) == (512, 128)
    assert 15 < per_acc < 25
    assert 60 < staging_s < 120 and 0.1 < share < 0.5
    entry = checks[0].entry("horeka_gpu_n512_pytorch1.13", "strong", "deepcam")
    kept = [r for r in entry.runs if r.dropped is None]
    assert epochs == pytest.approx(sum(r.epochs for r in kept) / len(kept))
    assert verdict == entry.rcp.verdict
    # Fujitsu's weak cosmoflow logs no tracked_stats: no made-up throughput
    assert _rows(
        db, "SELECT samples_per_s_per_accelerator FROM entries WHERE submitter = 'Fujitsu+RIKEN'"
    ) == [(None,)]


def test_adding_again_replaces_the_entry_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(HELMHOLTZ), "--db", str(db)]) == 0
    first = _rows(db, "SELECT id, submitter, system, scaling, benchmark, score_min FROM entries ORDER BY id")
    runs = _rows(db, "SELECT count(*) FROM runs")
    assert main(["results", "add", str(HELMHOLTZ), str(NCSA), "--db", str(db)]) == 0
    assert "(5 replaced)" in capsys.readouterr().out
    again = _rows(db, "SELECT id, submitter, system, scaling, benchmark, score_min FROM entries ORDER BY id")
    assert again[: len(first)] == first  # same ids, same values
    assert len(again) == len(first) + 1
    assert _rows(db, "SELECT count(*) FROM runs WHERE entry_id <= ?", len(first)) == runs


def test_one_transaction_a_failed_add_leaves_the_store_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the failure is planted as a trigger, which the store's schema check refuses (tested in
    # test_store_trust.py); here the check is off so that SQLite itself fails half way
    from mlhpc.results import store

    monkeypatch.setattr(store, "_verify_schema", lambda connection, db: None)
    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(NCSA), "--db", str(db)]) == 0
    before = _rows(db, "SELECT * FROM entries"), _rows(db, "SELECT * FROM runs")
    # SQLite itself fails the 20th run row of this add, half way through HelmholtzAI's entries
    with sqlite3.connect(db) as connection:
        connection.execute(
            "CREATE TRIGGER stop_half_way BEFORE INSERT ON runs WHEN (SELECT count(*) FROM runs) >= "
            f"{len(before[1]) + 20} BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
        )
    capsys.readouterr()
    assert main(["results", "add", str(HELMHOLTZ), "--db", str(db)]) == 2
    line = _error_line(capsys)
    assert str(db) in line and "the disk is full" in line and "nothing was stored" in line
    assert (_rows(db, "SELECT * FROM entries"), _rows(db, "SELECT * FROM runs")) == before


_HOLD_WRITE_LOCK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
connection.execute("COMMIT")
"""


def test_two_processes_adding_at_once(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(NCSA), "--db", str(db)]) == 0  # the file exists, empty of others
    weak = tmp_path / "hpc_results_v3.0"
    shutil.copytree(WEAK, weak)
    # A third process holds the write lock while both adds start: each must wait, then write.
    with held_by_another_process(_HOLD_WRITE_LOCK, str(db)):
        adds = [
            subprocess.Popen(
                [sys.executable, "-m", "mlhpc", "results", "add", str(folder), "--db", str(db)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(),
                cwd=tmp_path,
            )
            for folder in (HELMHOLTZ, weak)
        ]
        time.sleep(6)  # both checked their folders and now wait on the lock
        assert all(p.poll() is None for p in adds)
    for process in adds:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert _rows(db, "PRAGMA integrity_check") == [("ok",)]
    counts = dict(_rows(db, "SELECT ruleset, count(*) FROM entries GROUP BY ruleset"))
    assert counts == {"1.0.0": 1, "2.0.0": 5, "3.0.0": 2}
    assert _rows(db, "SELECT count(*) FROM runs WHERE entry_id NOT IN (SELECT id FROM entries)") == [(0,)]


def test_not_a_submission_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.sqlite"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["results", "add", str(empty), "--db", str(db)]) == 2
    line = _error_line(capsys)
    assert str(empty) in line and line.count("; pass ") == 1
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    # one bad path among good folders: the others are stored, each bad one named, exit 1 (issue 40)
    assert main(["results", "add", str(HELMHOLTZ), str(a_file), "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(a_file) in err.strip().splitlines()[-1]
    assert _rows(db, "SELECT count(*) FROM entries") != [(0,)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(min_size=1, max_size=4096), sqlite_header=st.booleans())
def test_a_corrupt_store_is_one_line_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: bytes, sqlite_header: bool
) -> None:
    db = tmp_path / "corrupt.sqlite"
    content = (b"SQLite format 3\x00" if sqlite_header else b"") + body
    db.write_bytes(content)
    capsys.readouterr()
    # Bytes that are not an mlhpc store: each command refuses with one line naming the file, and
    # leaves it as it was (never removed, rewritten, or "repaired" into an empty store).
    for args in (["list"], ["compare", "1"], ["add", str(NCSA)]):
        assert main(["results", *args, "--db", str(db)]) == 2, args
        assert str(db) in _error_line(capsys), args
        assert db.read_bytes() == content, args


def test_a_one_byte_file_is_refused_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SQLite opens a file of a single byte as a new, empty database and would write its schema
    # over it: mlhpc refuses bytes without SQLite's header before SQLite sees them.
    db = tmp_path / "one-byte.sqlite"
    db.write_bytes(b"x")
    for args in (["list"], ["compare", "1"], ["add", str(NCSA)]):
        assert main(["results", *args, "--db", str(db)]) == 2, args
        assert str(db) in _error_line(capsys) and db.read_bytes() == b"x", args


def test_a_store_that_is_truncated_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(HELMHOLTZ), "--db", str(db)]) == 0
    db.write_bytes(db.read_bytes()[: 4096 + 100])  # the header survives, the pages do not
    capsys.readouterr()
    assert main(["results", "list", "--db", str(db)]) == 2
    line = _error_line(capsys)
    assert str(db) in line and "--db" in line


def test_another_programs_database_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "theirs.sqlite"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE accounts (name TEXT)")
        connection.execute("INSERT INTO accounts VALUES ('alice')")
    content = db.read_bytes()
    assert main(["results", "add", str(NCSA), "--db", str(db)]) == 2
    line = _error_line(capsys)
    assert str(db) in line and "another program" in line
    assert db.read_bytes() == content
    folder = tmp_path / "a_folder.sqlite"
    folder.mkdir()
    assert main(["results", "list", "--db", str(folder)]) == 2
    assert "not a regular file" in _error_line(capsys)
    assert main(["results", "list", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "mlhpc results add" in _error_line(capsys)


def test_compare_our_entry_against_the_published(tmp_path: Path) -> None:
    ours = tmp_path / "runs" / "HelmholtzAI"  # not named for a round: our own
    shutil.copytree(HELMHOLTZ / "HelmholtzAI", ours)
    db = tmp_path / "store.sqlite"
    done = mlhpc_cli(["results", "add", str(HELMHOLTZ), str(NCSA), str(ours), "--db", str(db)], tmp_path)
    assert done.returncode == 0, done.stderr
    ours_id = _rows(
        db, "SELECT id FROM entries WHERE origin = 'ours' AND system LIKE 'juwels%' AND benchmark = 'deepcam'"
    )
    assert len(ours_id) == 1
    report = tmp_path / "compare"
    done = mlhpc_cli(
        [
            "results",
            "compare",
            "ours/2.0.0/HelmholtzAI/juwelsbooster_gpu_n2048_pytorch1.13/strong/deepcam",
            "--db",
            str(db),
            "--report",
            str(report),
        ],
        tmp_path,
        COLUMNS="250",
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "deepcam" in line and "│" in line]
    # our entry first, then the two published deepcam entries (not oc20, not cosmoflow, not ours again)
    assert len(lines) == 3 and lines[0].split("│")[1].strip() == str(ours_id[0][0])
    assert sum("published" in line for line in lines) == 2
    page = (report / "index.html").read_text()
    assert "data:image/png;base64," in page and "horeka_gpu_n512_pytorch1.13" in page
    assert (report / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # by a tail that names two entries: one line listing both ids
    done = mlhpc_cli(
        ["results", "compare", "juwelsbooster_gpu_n2048_pytorch1.13/strong/deepcam", "--db", str(db)],
        tmp_path,
    )
    assert done.returncode == 2 and "matches 2 entries" in done.stderr and "Traceback" not in done.stderr


def test_energy_and_pruned_runs_reach_the_csv_the_html_and_the_store(tmp_path: Path) -> None:
    import csv
    import random

    from mlhpc.submission_checker.export import report_csv
    from mlhpc.submission_checker.html_report import report_html
    from tests.helpers.submissions import DEEPCAM, SYSTEM, add_power, make_entry

    org, entry = make_entry(tmp_path, DEEPCAM, SYSTEM, "strong", [f"result_{i}.txt" for i in range(5)])
    add_power(entry, random.Random(7), nodes=2, switches=1)
    energy = check_submission(org, ruleset="2.0.0")
    weak = check_submission(WEAK)
    expected_j = energy.entries[0].energy_j
    assert expected_j is not None and expected_j > 0

    row = next(csv.DictReader(io.StringIO(report_csv(energy))))
    assert float(row["energy_j"]) == expected_j  # full precision, as the scores
    assert row["models_per_kwh"] == ""  # strong scaling has none
    rows = {r["system"]: r for r in csv.DictReader(io.StringIO(report_csv(weak)))}
    fujitsu = rows["fugaku_82944xA64FX_tensorflow_closed"]
    assert (fujitsu["pruned_runs"], fujitsu["energy_j"]) == ("11", "")

    page = report_html(energy)
    assert f"Energy to train: <b>{expected_j / 3.6e6:.6g} kWh</b>" in page
    summary = report_html(weak).split("<section", 1)[0]
    assert "<th>pruned</th>" in summary and "<td class=n>11</td>" in summary
    section = next(s for s in report_html(weak).split("<section")[1:] if "fugaku" in s)
    pruned = section.split("Pruned runs (11, not scored)", 1)[1].split("</table>", 1)[0]
    assert pruned.count("<tr><td><code>") == 11 and pruned.count("pruned_results/") == 11

    db = tmp_path / "store.sqlite"
    assert main(["results", "add", str(org), "--db", str(db)]) == 0
    assert _rows(db, "SELECT energy_j FROM entries") == [(expected_j,)]
