"""A neighbour's files in the shared node-local folder ($TMPDIR, /tmp) and in lock files: parsed
defensively, never a traceback, and nothing deleted that mlhpc cannot prove it made (issue 31,
"A neighbour's files break a run")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.common.errors import MlhpcError
from mlhpc.common.safeio.locks import LOCK_NAME, FolderBusy, folder_lock
from mlhpc.staging.localdir import STAGE_OWNER, claim_stage_dir, remove_stale_stage_dirs
from tests.helpers.cli import cli_env
from tests.helpers.processes import lock_held_elsewhere


def _dead_pid() -> int:
    """A pid no process has now: a forked child that has exited and been reaped."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _real_owner(root: Path) -> dict[str, object]:
    """The marker mlhpc writes, as this process."""
    probe = root / "probe"
    claim_stage_dir(probe, root / "out")
    owner = json.loads((probe / STAGE_OWNER).read_text())
    (probe / STAGE_OWNER).unlink()
    probe.rmdir()
    return owner


def _plant(root: Path, name: str, marker: bytes | None) -> Path:
    folder = root / f"mlhpc-stage-cosmoflow-{name}"
    (folder / "data").mkdir(parents=True)
    (folder / "data/sample.npy").write_bytes(b"kept")
    if marker is not None:
        (folder / STAGE_OWNER).write_bytes(marker)
    return folder


def _object_text(fields: dict[str, str]) -> str:
    """A JSON object from already-encoded values (so 1e400, NaN and 2**70 stay as written)."""
    return "{" + ", ".join(f"{json.dumps(key)}: {value}" for key, value in fields.items()) + "}"


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
).map(json.dumps)
_RAW = st.sampled_from(
    ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", str(2**70), str(-(2**70)), "9" * 5000, "1.5", "-0.0"]
)
_DEEP = st.integers(min_value=1, max_value=20_000).map(_deep)
_ANY = _JSON | _RAW | _DEEP


def _not(valid: object) -> st.SearchStrategy[str]:
    """Encoded values other than those `valid(decoded)` accepts as a sane field."""

    def ok(text: str) -> bool:
        try:
            return valid(json.loads(text))  # type: ignore[operator]
        except (ValueError, RecursionError):
            return False

    return _ANY.filter(lambda text: not ok(text))


def _is_pid(v: object) -> bool:
    return type(v) is int and 0 < v <= 2**22


# For each field the values that must not prove an owner (a string boot_id of another boot is a
# valid "rebooted since", an int start_ticks a valid "pid reused": those are no hostile values).
_HOSTILE_FIELDS = {
    "pid": _not(_is_pid),
    "host": _not(lambda v: isinstance(v, str)),
    "boot_id": _not(lambda v: v is None or isinstance(v, str)),
    "pid_namespace": _not(lambda v: v is None or isinstance(v, str)),
    "start_ticks": _not(lambda v: v is None or (type(v) is int and 0 <= v < 2**63)),
    "uid": _not(lambda v: type(v) is int and v == os.getuid()),
}


@st.composite
def hostile_markers(draw: st.DrawFn, base: dict[str, object]) -> bytes:
    """A marker mlhpc must not act on: random bytes, random or deep JSON, or mlhpc's own marker
    of a dead process with one field made hostile (that marker unchanged would be removed)."""
    kind = draw(st.sampled_from(["bytes", "json", "field"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return draw(_ANY).encode()
    field = draw(st.sampled_from(sorted(_HOSTILE_FIELDS)))
    encoded = {key: json.dumps(value) for key, value in base.items()}
    encoded[field] = draw(_HOSTILE_FIELDS[field])
    return _object_text(encoded).encode()


@pytest.fixture(scope="module")
def dead_owner(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """mlhpc's marker as a killed run leaves it: this host, this pid namespace, a pid now gone."""
    owner = _real_owner(tmp_path_factory.mktemp("owner"))
    return {**owner, "pid": _dead_pid()}


def test_a_dead_runs_marker_unchanged_is_removed(tmp_path: Path, dead_owner: dict[str, object]) -> None:
    """The control for the property below: the base marker, unchanged, proves a stale folder."""
    stale = _plant(tmp_path, "stale", json.dumps(dead_owner).encode())
    assert remove_stale_stage_dirs(tmp_path) == [stale]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_owner_markers_are_left_alone_without_a_traceback(
    data: st.DataObject, dead_owner: dict[str, object]
) -> None:
    marker = data.draw(hostile_markers(dead_owner), label="marker")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        planted = _plant(root, "planted", marker)
        stale = _plant(root, "stale", json.dumps(dead_owner).encode())
        live = root / "mlhpc-stage-cosmoflow-live"
        claim_stage_dir(live, root / "out")

        removed = remove_stale_stage_dirs(root)

        assert removed == [stale]  # the real stale one still goes: a neighbour blocks nothing
        assert (planted / STAGE_OWNER).read_bytes() == marker
        assert (planted / "data/sample.npy").read_bytes() == b"kept"
        assert (live / STAGE_OWNER).is_file()


def test_markers_that_are_not_plain_files_are_left_alone(
    tmp_path: Path, dead_owner: dict[str, object]
) -> None:
    """A FIFO (which would block a plain open), a link to a valid marker, a folder, a huge file."""
    valid = json.dumps(dead_owner).encode()
    fifo = _plant(tmp_path, "fifo", None)
    os.mkfifo(fifo / STAGE_OWNER)
    linked = _plant(tmp_path, "link", None)
    (tmp_path / "elsewhere.json").write_bytes(valid)
    (linked / STAGE_OWNER).symlink_to(tmp_path / "elsewhere.json")
    folder = _plant(tmp_path, "folder", None)
    (folder / STAGE_OWNER).mkdir()
    huge = _plant(tmp_path, "huge", valid[:-1] + b" " * 100_000 + b"}")
    # A link named like a staging folder, to a stale one elsewhere: the link is not ours to follow.
    target = _plant(tmp_path / "away", "target", valid)
    (tmp_path / "mlhpc-stage-cosmoflow-pointer").symlink_to(target)

    assert remove_stale_stage_dirs(tmp_path) == []
    for kept in (fifo, linked, folder, huge, target):
        assert (kept / "data/sample.npy").read_bytes() == b"kept"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")
def test_another_users_folder_or_marker_is_never_removed(
    tmp_path: Path, dead_owner: dict[str, object]
) -> None:
    """A marker that would prove a stale folder, but in another user's folder, or written by another
    user into one of ours, or naming another uid: none of them is mlhpc's to remove."""
    other = 65534
    valid = json.dumps(dead_owner).encode()
    their_folder = _plant(tmp_path, "their-folder", valid)
    for path in (their_folder, their_folder / STAGE_OWNER):
        os.chown(path, other, other)
    their_marker = _plant(tmp_path, "their-marker", valid)
    os.chown(their_marker / STAGE_OWNER, other, other)
    other_uid = _plant(tmp_path, "other-uid", json.dumps({**dead_owner, "uid": other}).encode())

    assert remove_stale_stage_dirs(tmp_path) == []
    for kept in (their_folder, their_marker, other_uid):
        assert (kept / "data/sample.npy").read_bytes() == b"kept"


def test_an_unreadable_marker_of_ours_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, dead_owner: dict[str, object]
) -> None:
    planted = _plant(tmp_path, "deep", _object_text({"pid": _deep(100_000)}).encode())
    assert remove_stale_stage_dirs(tmp_path) == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(planted / STAGE_OWNER) in warning and "left alone" in warning and "\n" not in warning


def test_mlhpc_run_beside_a_neighbours_hostile_markers(tmp_path: Path, dead_owner: dict[str, object]) -> None:
    """The issue's case end to end: deeply nested JSON and a huge pid planted in the node-local
    folder; `mlhpc run` finishes, says one warning line for each, and removes neither."""
    local = tmp_path / "local"
    deep = _plant(local, "deep", _deep(50_000).encode())
    huge_pid = _plant(
        local,
        "huge-pid",
        _object_text({**{k: json.dumps(v) for k, v in dead_owner.items()}, "pid": str(2**70)}).encode(),
    )
    args = ["run", "cosmoflow", "--config", "mini", "--seeds", "1", "--out", str(tmp_path / "out")]
    args += ["--local-dir", str(local), "--system", "ci", "--no-check"]
    args += ["data.num_train_samples=64", "data.num_eval_samples=16", "loop.target=10"]
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("left alone") == 2, proc.stderr
    for kept in (deep, huge_pid):
        assert (kept / "data/sample.npy").read_bytes() == b"kept"


# --- lock files: whoever can write the folder can write the holder's record ----------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200) | _ANY.map(str.encode) | hostile_markers({"pid": 1, "host": "h"}))
def test_a_held_locks_record_of_any_content_is_one_busy_line(content: bytes, held_folder: Path) -> None:
    (held_folder / LOCK_NAME).write_bytes(content)  # the holder keeps its lock: it is on the inode
    with pytest.raises(FolderBusy) as busy, folder_lock(held_folder, "a test", "wait"):
        pytest.fail("the lock was taken although another process holds it")
    message = str(busy.value)
    assert message.startswith(f"{held_folder} is in use by ") and message.endswith("; wait")
    assert "\n" not in message and "\x1b" not in message


def test_a_lock_record_with_terminal_codes_is_shown_as_text(held_folder: Path) -> None:
    record = {"pid": 42, "host": "node\x1b[2K\rPASSED", "what": "x\u202e", "since": 0}
    (held_folder / LOCK_NAME).write_text(json.dumps(record))
    with pytest.raises(FolderBusy) as busy, folder_lock(held_folder, "a test", "wait"):
        pass
    assert "pid 42 on node\\x1b[2K\\x0dPASSED (x\\u202e)" in str(busy.value)


def test_a_waiting_lock_takes_the_folder_when_its_holder_lets_go_and_is_busy_past_its_wait(
    tmp_path: Path,
) -> None:
    with lock_held_elsewhere(tmp_path):
        started = time.monotonic()
        with pytest.raises(FolderBusy), folder_lock(tmp_path, "a test", "wait", wait_s=0.6):
            pytest.fail("the lock was taken although another process holds it")
        assert time.monotonic() - started >= 0.6
    holder = lock_held_elsewhere(tmp_path)
    holder.__enter__()
    letting_go = threading.Timer(0.5, holder.__exit__, (None, None, None))
    letting_go.start()
    try:
        with folder_lock(tmp_path, "a test", "wait", wait_s=60) as path:
            assert json.loads(path.read_text())["pid"] == os.getpid()
    finally:
        letting_go.join()


def test_a_fifo_as_lock_file_is_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOCK_NAME)
    with pytest.raises(MlhpcError) as refused, folder_lock(tmp_path, "a test", "wait"):
        pass
    assert "not a regular file" in str(refused.value) and str(tmp_path / LOCK_NAME) in str(refused.value)


@pytest.fixture(scope="module")
def held_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("held")
    with lock_held_elsewhere(folder):
        yield folder
