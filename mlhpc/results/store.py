"""The results store: every checked entry (ours and the published rounds') in one SQLite file.

Rows come from what `mlhpc check` computes (`CheckReport`); nothing re-reads the logs. One
`add` is one transaction; SQLite's file locking with a busy timeout lets two processes add at once.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.errors import MlhpcError
from mlhpc.common.printable import shown
from mlhpc.common.safeio import safe_read
from mlhpc.results.rows import entry_row, run_rows
from mlhpc.submission_checker.report import CheckReport

DB_ENV = "MLHPC_RESULTS_DB"
APPLICATION_ID = 0x6D6C6870  # "mlhp" in the SQLite header: marks a file this program made
SCHEMA_VERSION = 1
MAX_ID = 2**63 - 1
"""SQLite's largest INTEGER: a longer id names no entry."""
MAX_ID_DIGITS = len(str(MAX_ID))
BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for another process's transaction before giving up."""
ORIGINS = ("published", "ours")
IDENTITY = ("origin", "ruleset", "submitter", "system", "scaling", "benchmark")
ENTRY_COLUMNS = (
    *IDENTITY,
    "division",
    "source",
    "nodes",
    "accelerators",
    "num_models",
    "runs",
    "pruned_runs",
    "score_raw_min",
    "score_min",
    "rcp_scaling_factor",
    "models_per_min",
    "rcp_verdict",
    "epochs",
    "staging_s",
    "staging_share",
    "samples_per_s_per_accelerator",
    "energy_j",
    "energy_total_j",
    "models_per_kwh",
    "errors",
    "warnings",
    "added_at",
)
RUN_COLUMNS = (
    "entry_id",
    "file",
    "pruned",
    "minutes",
    "compliant",
    "dropped",
    "epochs",
    "staging_s",
    "samples_per_s",
    "nodes",
    "accelerators",
)
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    {", ".join(f"{c} TEXT NOT NULL" for c in IDENTITY)},
    division TEXT, source TEXT NOT NULL, nodes INTEGER, accelerators INTEGER, num_models INTEGER,
    runs INTEGER NOT NULL, pruned_runs INTEGER NOT NULL, score_raw_min REAL, score_min REAL,
    rcp_scaling_factor REAL, models_per_min REAL, rcp_verdict TEXT, epochs REAL, staging_s REAL,
    staging_share REAL, samples_per_s_per_accelerator REAL, energy_j REAL, energy_total_j REAL,
    models_per_kwh REAL, errors INTEGER NOT NULL, warnings INTEGER NOT NULL, added_at TEXT NOT NULL,
    UNIQUE ({", ".join(IDENTITY)})
);
CREATE TABLE IF NOT EXISTS runs (
    entry_id INTEGER NOT NULL REFERENCES entries(id), file TEXT NOT NULL, pruned INTEGER NOT NULL,
    minutes REAL, compliant INTEGER NOT NULL, dropped TEXT, epochs REAL, staging_s REAL,
    samples_per_s REAL, nodes INTEGER, accelerators INTEGER
);
CREATE INDEX IF NOT EXISTS runs_by_entry ON runs(entry_id);
CREATE INDEX IF NOT EXISTS entries_by_benchmark ON entries(benchmark);
"""


def default_db() -> Path:
    """$MLHPC_RESULTS_DB, else $XDG_DATA_HOME/mlhpc/results.sqlite (~/.local/share/mlhpc/...)."""
    if os.environ.get(DB_ENV):
        return Path(os.environ[DB_ENV])
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "mlhpc" / "results.sqlite"


def _fix(db: Path) -> str:
    return f"move {db} away (it is not deleted) or pass --db with another file"


@contextlib.contextmanager
def _sqlite_errors(db: Path) -> Iterator[None]:
    """sqlite3's errors as one MlhpcError naming the file and the fix."""
    try:
        yield
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise MlhpcError(
                f"{db} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s; retry when it is done"
            ) from e
        raise MlhpcError(f"cannot use the results store {db} ({e}); check the file and its folder") from e
    except sqlite3.DatabaseError as e:
        if any(word in str(e) for word in ("not a database", "malformed", "corrupt")):
            raise MlhpcError(f"{db} is not a readable results store ({e}); {_fix(db)}") from e
        raise MlhpcError(f"the results store {db} refused the write ({e}); nothing was stored") from e


@contextlib.contextmanager
def open_store(db: Path | str, *, create: bool) -> Iterator[sqlite3.Connection]:
    """A connection to the store `db` (made when `create` and it does not exist yet).

    Refused with one line: a path that is not a regular file, a file that is not SQLite or is
    another program's database, a store from a newer mlhpc.
    """
    db = Path(db)
    if db.exists() or db.is_symlink():
        why = safe_read.refusal(db, what="a results store")
        if why is not None:
            raise MlhpcError(f"results store {db}: {why.reason}; {_fix(db)}")
        _refuse_what_is_not_sqlite(db)
    elif not create:
        raise MlhpcError(f"no results store at {db}; add entries first: mlhpc results add DIR --db {db}")
    else:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MlhpcError(
                f"cannot make {db.parent} ({e.strerror or e}); pass --db in a writable folder"
            ) from e
    with _sqlite_errors(db):
        connection = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        with _sqlite_errors(db):
            connection.execute("PRAGMA foreign_keys = ON")
            _prepare(connection, db)
            yield connection
    finally:
        connection.close()


SQLITE_HEADER = b"SQLite format 3\x00"


def _refuse_what_is_not_sqlite(db: Path) -> None:
    """A file that holds bytes but not SQLite's header is someone's data: SQLite would take a
    file shorter than a page for an empty database and write over it. An empty file has nothing
    to lose."""
    try:
        with db.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except OSError as e:
        raise MlhpcError(f"cannot read the results store {db} ({e.strerror or e}); {_fix(db)}") from e
    if head and head != SQLITE_HEADER:
        raise MlhpcError(f"{db} is not a results store (no SQLite header); {_fix(db)}")


def _prepare(connection: sqlite3.Connection, db: Path) -> None:
    """Check the file is ours (or empty) and make the tables, in one write transaction."""
    app = connection.execute("PRAGMA application_id").fetchone()[0]
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if app == APPLICATION_ID and version == SCHEMA_VERSION:
        _verify_schema(connection, db)
        return
    if app == APPLICATION_ID and version > SCHEMA_VERSION:
        raise MlhpcError(f"{db} was written by a newer mlhpc (schema {version}); upgrade mlhpc")
    connection.execute("BEGIN IMMEDIATE")
    try:
        app = connection.execute("PRAGMA application_id").fetchone()[0]
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app != APPLICATION_ID and (app != 0 or tables):
            raise MlhpcError(f"{db} is another program's SQLite database, not a results store; {_fix(db)}")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                connection.execute(statement)
        _verify_schema(connection, db)  # an empty file with our id may still hold a planted object
        connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise


@dataclass(frozen=True)
class Added:
    entries: int
    replaced: int
    runs: int


def add_reports(connection: sqlite3.Connection, reports: Sequence[tuple[CheckReport, str]]) -> Added:
    """Store every entry of each (report, origin) in one transaction; an entry already stored
    under the same identity (origin, ruleset, submitter, system, scaling, benchmark) is replaced,
    keeping its id."""
    added_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    where = " AND ".join(f"{c} = ?" for c in IDENTITY)
    insert_entry = (
        f"INSERT INTO entries (id, {', '.join(ENTRY_COLUMNS)}) VALUES (?{', ?' * len(ENTRY_COLUMNS)})"
    )
    insert_run = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' * len(RUN_COLUMNS))})"
    entries = replaced = runs = 0
    connection.execute("BEGIN IMMEDIATE")  # the write lock now: no reader-to-writer upgrade deadlock
    try:
        for report, origin in reports:
            for entry in report.entries:
                row = entry_row(report, entry, origin, added_at)
                old = connection.execute(
                    f"SELECT id FROM entries WHERE {where}", [row[c] for c in IDENTITY]
                ).fetchone()
                if old is not None:
                    connection.execute("DELETE FROM runs WHERE entry_id = ?", (old[0],))
                    connection.execute("DELETE FROM entries WHERE id = ?", (old[0],))
                    replaced += 1
                cursor = connection.execute(
                    insert_entry, [None if old is None else old[0], *(row[c] for c in ENTRY_COLUMNS)]
                )
                its_runs = run_rows(int(cursor.lastrowid or 0), entry)
                connection.executemany(insert_run, its_runs)
                entries, runs = entries + 1, runs + len(its_runs)
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return Added(entries, replaced, runs)


INTEGER_COLUMNS = frozenset(
    {"id", "nodes", "accelerators", "num_models", "runs", "pruned_runs", "errors", "warnings"}
)
TEXT_COLUMNS = frozenset({*IDENTITY, "division", "source", "rcp_verdict", "added_at"})
NOT_NULL = frozenset({"id", *IDENTITY, "source", "runs", "pruned_runs", "errors", "warnings", "added_at"})


def _unwritten(column: str, value: Any) -> str | None:
    """Why `value` in `column` is not what `add_reports` writes (SQLite keeps any type in any
    column, and `1e400` as infinity), or None when it could be."""
    if value is None:
        return "empty" if column in NOT_NULL else None
    if column in TEXT_COLUMNS:
        return None if isinstance(value, str) else f"{type(value).__name__} {value!r}, not text"
    if column in INTEGER_COLUMNS:
        ok = isinstance(value, int) and 0 <= value < 2**53
        return None if ok else f"{value!r}, not a count"
    if not isinstance(value, (int, float)):
        return f"{type(value).__name__} {shown(value)[:40]!r}, not a number"
    return None if math.isfinite(value) and value >= 0 else f"{value!r}, not a finite number ≥ 0"


def _checked(row: sqlite3.Row, db: str) -> dict[str, Any]:
    """The row as a dict, or one MlhpcError naming the file, the entry and the column that no
    mlhpc wrote (a hand-edited or damaged store)."""
    entry = dict(row)
    for column, value in entry.items():
        why = _unwritten(column, value)
        if why is None and column == "origin" and value not in ORIGINS:
            why = f"{shown(value)!r}, not one of {', '.join(ORIGINS)}"
        if why is not None:
            raise MlhpcError(
                f"results store {shown(db)}: entry {shown(entry.get('id'))}'s {column} is {why}; mlhpc never "
                f"writes that, the file was changed by hand or damaged: {_fix(Path(db))}, then add again"
            )
    return entry


@functools.cache
def _expected_objects() -> frozenset[tuple[str, str, str, str | None]]:
    """sqlite_master of a store made by SCHEMA: every table, index and its SQL, nothing else."""
    with contextlib.closing(sqlite3.connect(":memory:")) as memory:
        memory.executescript(SCHEMA)
        return frozenset(memory.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))


def _verify_schema(connection: sqlite3.Connection, db: Path) -> None:
    """Refuse a store whose objects differ from SCHEMA in any way: a planted trigger (which would
    run on the next `add`), a view, an extra table or index, a changed column. Checked on every
    open, before anything is read or written."""
    found = frozenset(connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    extra, missing = found - _expected_objects(), _expected_objects() - found
    if extra or missing:
        what = sorted(f"{kind} {shown(name)}" for kind, name, _, _ in extra) or [
            f"missing or changed {kind} {name}" for kind, name, _, _ in sorted(missing)
        ]
        raise MlhpcError(
            f"{db} is not a results store as mlhpc makes it ({', '.join(what[:5])}): nothing was "
            f"read or written; {_fix(db)}"
        )


def fetch_entries(
    connection: sqlite3.Connection, where: str = "", args: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """Entries as dicts (with their id), ordered by benchmark, ruleset, submitter, system, scaling;
    a value mlhpc never writes (text for a number, infinity, a negative count) is one MlhpcError."""
    connection.row_factory = sqlite3.Row
    order = " ORDER BY benchmark, ruleset, submitter, system, scaling"
    query = f"SELECT * FROM entries {f'WHERE {where}' if where else ''}{order}"
    db = connection.execute("PRAGMA database_list").fetchone()["file"]
    return [_checked(row, db) for row in connection.execute(query, list(args))]


def find_entry(connection: sqlite3.Connection, name: str, db: Path) -> dict[str, Any]:
    """One entry by id, or by [origin/][ruleset/]submitter/system/scaling/benchmark or any tail of it
    (system/scaling/benchmark); a miss or several matches is one line naming what exists."""
    if name.isascii() and name.isdigit():  # '²' is a digit to Python, not an id
        # an id beyond SQLite's 64-bit integers (or Python's 4300-digit int limit) is no entry
        number = int(name) if len(name) <= MAX_ID_DIGITS else MAX_ID + 1
        found = fetch_entries(connection, "id = ?", (number,)) if number <= MAX_ID else []
    else:
        parts = [p for p in name.strip("/").split("/") if p]
        found = [e for e in fetch_entries(connection) if _matches(e, parts)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise MlhpcError(
            f"no entry '{shown(name)}' in {shown(db)}; pass an id or submitter/system/scaling/benchmark "
            "(see mlhpc results list)"
        )
    names = ", ".join(f"{e['id']} ({shown(entry_name(e))})" for e in found[:10])
    raise MlhpcError(f"'{shown(name)}' matches {len(found)} entries in {shown(db)}: {names}; pass one id")


def _matches(entry: dict[str, Any], parts: list[str]) -> bool:
    full = [entry[c] for c in IDENTITY]
    return 0 < len(parts) <= len(full) and full[len(full) - len(parts) :] == parts


def entry_name(entry: dict[str, Any]) -> str:
    return "/".join(str(entry[c]) for c in IDENTITY)
