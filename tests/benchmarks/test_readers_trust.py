"""`mlhpc variability`, `mlhpc report` and `mlhpc run --resume` read results as safely as the
checker: a FIFO, a link loop or a link out is a one-line warning (an error for resume), never a
hang or a crash; timestamps going backwards leave a run out; a full result log is one error."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.campaign.resume import finished_runs
from mlhpc.common.errors import MlhpcError, SubmissionError
from mlhpc.common.safeio import safe_read
from mlhpc.common.training.mllogger import MLLog
from mlhpc.results.report import read_breakdowns, report_command
from mlhpc.results.variability import read_runs, variability_command
from tests.helpers.cli import mlhpc_cli
from tests.helpers.mllog_files import write_log

BREAKDOWN = {
    "seed": 7,
    "seconds": {"forward": 1.0, "backward": 2.0},
    "time_to_train_s": 4.0,
    "init_s": 1.0,
    "flops_per_sample": 1e9,
    "achieved_flops_per_s": 1e12,
    "train_samples_seen": 64,
}


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened for reading) fails the test instead of hanging it."""

    def alarm(signum: int, frame: object) -> None:
        raise TimeoutError("a read blocked")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(180)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    """Three good runs (2, 3 and 4 minutes) in one results folder, plus hostile neighbours."""
    folder = tmp_path / "results"
    for index, minutes in enumerate((2.0, 3.0, 4.0)):
        write_log(folder / f"result_{index}.txt", 10 + index, minutes, 3)
    os.mkfifo(folder / "result_3.txt")
    (folder / "result_4.txt").symlink_to(folder / "result_4.txt")
    outside = tmp_path / "elsewhere.txt"
    write_log(outside, 99, 1.0, 1)
    (folder / "result_5.txt").symlink_to(outside)
    (folder / "loop").symlink_to(folder)  # a folder link loop: each folder is read once
    return folder


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_variability_skips_what_it_cannot_read(campaign: Path, caplog: pytest.LogCaptureFixture) -> None:
    ((folder, runs),) = read_runs(campaign).items()
    assert folder == campaign and sorted(r.minutes for r in runs) == [2.0, 3.0, 4.0]
    messages = warnings_of(caplog)
    assert len(messages) == 3 and all("\n" not in m for m in messages)
    by_name = {Path(m.split()[1].rstrip(":")).name: m for m in messages}
    assert "not a regular file" in by_name["result_3.txt"]
    assert "loop" in by_name["result_4.txt"]
    assert "outside" in by_name["result_5.txt"] and "copy the file" in by_name["result_5.txt"]
    with pytest.raises(SubmissionError, match=r"result_3\.txt: not a regular file"):
        read_runs(campaign / "result_3.txt")


def test_timestamps_going_backwards_leave_the_run_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for index, minutes in enumerate((2.0, 3.0, -4.0)):
        write_log(tmp_path / f"result_{index}.txt", index, minutes, 3)
    write_log(tmp_path / "result_3.txt", 3, math.inf, 3)
    ((_, runs),) = read_runs(tmp_path).items()
    assert sorted(r.minutes for r in runs) == [2.0, 3.0]
    backwards, broken = warnings_of(caplog)
    assert "result_2.txt" in backwards and "backwards" in backwards and "4.000 min" in backwards
    assert "result_3.txt" in broken and "not a plausible number" in broken


def test_implausible_epochs_leave_the_run_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for index, epoch in enumerate((3, 1e308, 1e308, -1, math.nan)):
        (tmp_path / f"result_{index}.txt").write_text(finished_log(0, 60_000, epoch, index))
    ((_, runs),) = read_runs(tmp_path).items()
    assert [r.epochs for r in runs] == [3]
    assert len(warnings_of(caplog)) == 4


def test_variability_command_line_on_a_fifo_does_not_hang(campaign: Path) -> None:
    proc = mlhpc_cli(["variability", str(campaign)], campaign.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 successful runs" in proc.stdout
    assert proc.stderr.count("\n") == 3 and "Traceback" not in proc.stderr


def write_breakdown(path: Path, **changes: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**BREAKDOWN, **changes}))


def test_report_skips_what_it_cannot_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "breakdown" / "entry"
    write_breakdown(folder / "result_0.json")
    write_breakdown(folder / "result_1.json", time_to_train_s=-3.0)
    (folder / "result_2.json").write_text("[1, 2]")
    os.mkfifo(folder / "result_3.json")
    (folder / "result_4.json").symlink_to("result_4.json")
    (runs,) = read_breakdowns(tmp_path)
    assert runs.name == "entry/result_0" and runs.seed == 7
    messages = sorted(warnings_of(caplog))
    assert len(messages) == 4 and all("\n" not in m for m in messages)
    assert "negative time" in messages[0] and "a JSON list" in messages[1]
    assert "not a regular file" in messages[2] and "loop" in messages[3]
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_breakdowns(folder / "result_3.json")


def test_resume_refuses_a_result_slot_it_cannot_read(tmp_path: Path) -> None:
    write_log(tmp_path / "result_0.txt", 40, 1.0, 2)
    write_log(tmp_path / "result_1.txt", 41, 1.0, 2, status="aborted")
    assert finished_runs(sorted(tmp_path.glob("result_*.txt"))) == {0: 40}
    os.mkfifo(tmp_path / "result_2.txt")
    with pytest.raises(SubmissionError, match=r"result_2.txt: not a regular file.*then resume"):
        finished_runs(sorted(tmp_path.glob("result_*.txt")))
    (tmp_path / "result_2.txt").unlink()
    (tmp_path / "result_2.txt").symlink_to("result_2.txt")
    with pytest.raises(SubmissionError, match=r"result_2\.txt: is a symbolic link loop"):
        finished_runs(sorted(tmp_path.glob("result_*.txt")))
    (tmp_path / "result_2.txt").unlink()
    write_log(tmp_path / "result_2.txt", 1, 1.0, 2)
    (tmp_path / "result_2.txt").write_text(
        (tmp_path / "result_2.txt").read_text().replace('"value": 1,', '"value": 1.5,')
    )
    with pytest.raises(SubmissionError, match=r"seed 1\.5, not a whole number"):
        finished_runs(sorted(tmp_path.glob("result_*.txt")))


def test_safe_read_never_opens_a_fifo_for_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(safe_read.RefusedFile, match="not a regular file"):
        safe_read.open_text(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    assert safe_read.refusal(big, 10).kind == "too-big"
    with pytest.raises(safe_read.RefusedFile):
        safe_read.read_bytes(big, 10)
    assert safe_read.read_bytes(big, 11) == b"x" * 11


def test_safe_read_says_file_not_found_for_a_missing_name(tmp_path: Path) -> None:
    """A name that is not there is FileNotFoundError, as `open` gives, followed or not: a caller
    that expects a file to vanish (a neighbour's marker, renamed) tells that from a bad file."""
    missing = tmp_path / "gone"
    with pytest.raises(FileNotFoundError):
        safe_read.read_bytes(missing, 10)
    with pytest.raises(FileNotFoundError):
        safe_read.read_bytes_stat(missing, 10, follow=False)
    with pytest.raises(FileNotFoundError):
        safe_read.open_text(tmp_path / "no-folder" / "f")
    assert safe_read.refusal(missing).kind == "missing"
    (tmp_path / "dangling").symlink_to(missing)
    with pytest.raises(safe_read.RefusedFile, match="a symbolic link"):
        safe_read.read_bytes_stat(tmp_path / "dangling", 10, follow=False)
    with pytest.raises(FileNotFoundError):
        safe_read.read_bytes(tmp_path / "dangling", 10)  # followed: its target is missing


def test_a_full_result_log_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    result = tmp_path / "result_0.txt"
    (tmp_path / f".result_0.txt.{os.getpid()}.tmp").symlink_to("/dev/full")  # every write: ENOSPC
    log = MLLog(result, enabled=True, echo=False)
    with pytest.raises(SubmissionError, match=r"cannot write the result log .*result_0.txt.*free space"):
        log.event("seed", 1)
    log.event("seed", 2)  # raised once: the run's shutdown goes on quietly
    with pytest.raises(SubmissionError):
        log.close()  # never half a result
    assert not list(tmp_path.iterdir())


# The property: whatever bytes sit in result_*.txt / result_*.json, the readers answer with runs,
# warnings or one MlhpcError line, never another exception.
NUMBERS = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)
RECORDS = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["run_start", "run_stop", "eval_error", "eval_accuracy", "seed", "x"]),
        "time_ms": NUMBERS,
        "value": st.one_of(NUMBERS, st.lists(st.integers(), max_size=2)),
        "metadata": st.one_of(
            st.fixed_dictionaries(
                {"status": st.sampled_from(["success", "aborted", 1]), "epoch_num": NUMBERS}
            ),
            st.none(),
            st.integers(),
        ),
    }
)
LINES = st.one_of(
    RECORDS.map(lambda r: ":::MLLOG " + json.dumps(r)),
    st.text(max_size=40),
    st.just(":::MLLOG {"),
)
TIMES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**30), 10**30))


def finished_log(start: object, stop: object, epoch: object, seed: object) -> str:
    """A log that reached run_stop with status success, with arbitrary numbers where times go."""
    records = [
        {"key": "seed", "time_ms": 0, "value": seed, "metadata": {}},
        {"key": "run_start", "time_ms": start, "value": None, "metadata": {}},
        {"key": "eval_error", "time_ms": start, "value": 0.1, "metadata": {"epoch_num": epoch}},
        {"key": "run_stop", "time_ms": stop, "value": None, "metadata": {"status": "success"}},
    ]
    return "\n".join(":::MLLOG " + json.dumps(r) for r in records)


LOGS = st.one_of(
    st.builds(finished_log, TIMES, TIMES, TIMES, NUMBERS).map(str.encode),
    st.lists(LINES, max_size=12).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
)
BREAKDOWNS = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(
        st.sampled_from([*BREAKDOWN, "other"]), st.one_of(NUMBERS, st.just({"forward": 1})), max_size=8
    ).map(lambda d: json.dumps({**BREAKDOWN, **d}).encode()),
)


def one_line_or_result(call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except MlhpcError as e:
        assert "\n" not in str(e).strip(), str(e)


@settings(max_examples=100, deadline=None)
@given(logs=st.lists(LOGS, min_size=1, max_size=4), breakdowns=st.lists(BREAKDOWNS, min_size=1, max_size=3))
def test_any_bytes_give_runs_warnings_or_one_line(
    logs: list[bytes], breakdowns: list[bytes], monkeypatch_module: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for index, data in enumerate(logs):
            (root / f"result_{index}.txt").write_bytes(data)
        for index, data in enumerate(breakdowns):
            (root / "breakdown" / f"result_{index}.json").parent.mkdir(exist_ok=True)
            (root / "breakdown" / f"result_{index}.json").write_bytes(data)
        one_line_or_result(lambda: variability_command(root))
        one_line_or_result(lambda: report_command(root / "breakdown"))
        one_line_or_result(lambda: finished_runs(sorted(root.glob("result_*.txt"))))


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    """The olympic-mean factor's simulation is not under test here: a closed form keeps it fast."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mlhpc.results.variability.olympic_se_factor", lambda runs: 1 / math.sqrt(runs))
        yield patch
