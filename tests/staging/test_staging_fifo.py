"""FIFOs (and other files that are not regular) anywhere in a SRC given to `mlhpc manifest`,
`mlhpc stage` or `mlhpc verify` (issue 31, "hangs past every signal"): each is judged by its type
before it is opened, opened non-blocking and judged again, and refused in one line naming it;
nothing blocks, and SIGTERM ends the command promptly (143, no traceback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlhpc.common.errors import StagingError
from mlhpc.staging import (
    MANIFEST_NAME,
    STAGED_MARKER,
    StageRequest,
    build_manifest,
    stage_dataset,
    verify_staged,
)
from mlhpc.staging.manifest import hash_file
from tests.helpers.cli import cli_env, mlhpc, one_error_line, said_lines
from tests.helpers.datasets import two_file_source

TIMEOUT_S = 60
"""Far more than any of these takes; a FIFO that blocked would run into it."""


@pytest.mark.parametrize("where", ["fifo.bin", "sub/fifo.bin"])
def test_manifest_and_stage_refuse_a_fifo_in_src(tmp_path: Path, where: str) -> None:
    src = two_file_source(tmp_path / "src")
    os.mkfifo(src / where)
    line = one_error_line(mlhpc("manifest", src, timeout=TIMEOUT_S))
    assert f"{src / where} is a FIFO, not a regular file" in line and "move it out of the dataset" in line
    assert not (src / MANIFEST_NAME).exists()
    line = one_error_line(mlhpc("stage", src, tmp_path / "dest", timeout=TIMEOUT_S))
    assert f"{src / where} is a FIFO, not a regular file" in line
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


def test_a_link_to_a_fifo_and_a_socket_are_refused(tmp_path: Path) -> None:
    import socket

    src = two_file_source(tmp_path / "src")
    os.mkfifo(tmp_path / "outside-fifo")
    (src / "link.bin").symlink_to(tmp_path / "outside-fifo")
    with pytest.raises(StagingError, match=r"link\.bin is a FIFO, not a regular file"):
        build_manifest(src)
    (src / "link.bin").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))
        with pytest.raises(StagingError, match=r"sock is a socket, not a regular file"):
            stage_dataset(StageRequest(src, tmp_path / "dest", workers=2))


def test_a_manifest_that_names_a_fifo_is_refused_by_stage(tmp_path: Path) -> None:
    """With a manifest nothing is listed: the copy itself judges the file before reading it."""
    src = two_file_source(tmp_path / "src")
    build_manifest(src).write(src / MANIFEST_NAME)
    (src / "a.bin").unlink()
    os.mkfifo(src / "a.bin")
    line = one_error_line(mlhpc("stage", src, tmp_path / "dest", "--processes", "2", timeout=TIMEOUT_S))
    assert f"{src / 'a.bin'} is a FIFO, not a regular file" in line


def test_a_fifo_in_place_of_the_manifest_or_a_sidecar(tmp_path: Path) -> None:
    src = two_file_source(tmp_path / "src")
    os.mkfifo(src / MANIFEST_NAME)  # not a file: the source is listed instead, never blocked on
    assert stage_dataset(StageRequest(src, tmp_path / "dest", workers=2)).files == 2


def test_verify_refuses_a_fifo_in_place_of_a_staged_file(tmp_path: Path) -> None:
    src, dest = two_file_source(tmp_path / "src"), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    (dest / "a.bin").unlink()
    os.mkfifo(dest / "a.bin")
    line = one_error_line(mlhpc("verify", dest, timeout=TIMEOUT_S))
    assert str(dest / "a.bin") in line and "stage again" in line
    with pytest.raises(StagingError, match=r"a\.bin is a FIFO, not a regular file"):
        hash_file(dest / "a.bin")
    with pytest.raises(StagingError):
        verify_staged(dest)


def test_verify_refuses_a_fifo_in_place_of_the_sources_file(tmp_path: Path) -> None:
    from mlhpc.staging.journal import SOURCES_NAME

    src, dest = two_file_source(tmp_path / "src"), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    (dest / SOURCES_NAME).unlink()
    os.mkfifo(dest / SOURCES_NAME)
    proc = mlhpc("verify", dest, timeout=TIMEOUT_S)  # no records to judge the source by: said so, not blocked
    assert proc.returncode == 0 and "files verified" in proc.stdout, proc.stderr


def test_a_restage_over_a_fifo_journal_or_marker(tmp_path: Path) -> None:
    from mlhpc.staging.journal import JOURNAL_PREFIX

    src, dest = two_file_source(tmp_path / "src"), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    os.mkfifo(dest / f"{JOURNAL_PREFIX}0123456789ab.77.jsonl")
    (dest / MANIFEST_NAME).unlink()
    os.mkfifo(dest / MANIFEST_NAME)
    proc = mlhpc("stage", src, dest, timeout=TIMEOUT_S)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr


def test_sigterm_ends_a_manifest_run_promptly(tmp_path: Path) -> None:
    """A long `mlhpc manifest` (a FIFO at the very end of a big source) is ended by SIGTERM at
    once: exit 143, one line, no traceback; or it already refused the FIFO (exit 2)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"big{i}.bin").write_bytes(os.urandom(16 << 20))
    os.mkfifo(src / "zz-fifo.bin")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlhpc", "manifest", str(src), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert time.monotonic() - sent < 10
    assert "Traceback" not in err, err
    if proc.returncode == 143:
        assert err.strip() == "mlhpc: terminated", err
    else:
        # Refused first; a SIGTERM that lands while that process is already exiting (its
        # handlers gone) ends it by the signal, after the one line.
        assert proc.returncode in (2, -signal.SIGTERM) and "zz-fifo.bin is a FIFO" in err, (proc.returncode, err)
        assert len(said_lines(err)) == 1, err


def test_a_manifest_with_deep_nesting_or_huge_numbers_is_one_line(tmp_path: Path) -> None:
    src = two_file_source(tmp_path / "src")
    for text in (
        "[" * 100_000,
        '{"algorithm": "xxh3_128", "files": [{"path": "a.bin", "size": 1e400, "checksum": "x"}]}',
    ):
        (src / MANIFEST_NAME).write_text(text)
        line = one_error_line(mlhpc("stage", src, tmp_path / "dest", timeout=TIMEOUT_S))
        assert f"{src / MANIFEST_NAME}: " in line, line
        assert "nested more than" in line or "out of range" in line, line
    (src / MANIFEST_NAME).write_text(json.dumps({"algorithm": "xxh3_128", "files": [["a.bin", 100, "x"]]}))
    assert "malformed manifest" in one_error_line(mlhpc("stage", src, tmp_path / "dest", timeout=TIMEOUT_S))
