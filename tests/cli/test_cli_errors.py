"""Every way a command line can be wrong ends in one line naming the path or field and the fix,
through the real `python -m mlhpc`: no traceback, exit 2; SIGINT/SIGTERM exit 130/143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, mlhpc_cli, one_error_line
from tests.helpers.mllog_files import write_log
from tests.helpers.processes import ctrl_c_as_at_a_terminal, wait_for

# /sys refuses new files even to root, unlike a chmod 555 folder.
UNWRITABLE = "/sys/mlhpc-test"


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


def test_generate_with_no_samples(tmp_path: Path) -> None:
    for samples in ("0", "-3"):
        proc = mlhpc_cli(["generate", "cosmoflow", "--out", "d", "--samples", samples], tmp_path, 120)
        one_error_line(proc, f"--samples {samples}", "at least 1")
    assert not (tmp_path / "d").exists()


def test_generate_into_a_file_or_an_unwritable_folder(tmp_path: Path, a_file: Path) -> None:
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", str(a_file)], tmp_path, 120)
    one_error_line(proc, str(a_file), "is a file, not a folder")
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", str(a_file / "sub")], tmp_path, 120)
    one_error_line(proc, str(a_file), "--out")
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", UNWRITABLE], tmp_path, 120)
    one_error_line(proc, UNWRITABLE, "cannot create files", "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_generate_into_a_read_only_folder(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", str(locked / "d")], tmp_path, 120)
    one_error_line(proc, str(locked), "Permission denied")


def test_negative_num_workers_names_the_field(tmp_path: Path) -> None:
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", "d", "data.num_workers=-1"], tmp_path, 120)
    one_error_line(proc, "data.num_workers=-1", "set data.num_workers=")
    proc = mlhpc_cli(["generate", "deepcam", "--out", "d", "optimizer.lr=-0.1"], tmp_path, 120)
    one_error_line(proc, "optimizer.lr=-0.1", "positive")
    proc = mlhpc_cli(["generate", "extreme_weather", "--out", "d", "loop.global_batch_size=0"], tmp_path, 120)
    one_error_line(proc, "loop.global_batch_size=0")


def test_run_refuses_an_unwritable_out_or_local_dir_up_front(tmp_path: Path, a_file: Path) -> None:
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(a_file)], tmp_path, 120)
    one_error_line(proc, "--out", str(a_file))
    proc = mlhpc_cli(["run", "cosmoflow", "--out", "runs", "--local-dir", UNWRITABLE], tmp_path, 120)
    one_error_line(proc, "--local-dir", UNWRITABLE)
    env = cli_env(MLHPC_LOCAL_DIR=str(a_file))
    command = [sys.executable, "-m", "mlhpc", "run", "cosmoflow", "--out", "runs"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    one_error_line(proc, "MLHPC_LOCAL_DIR", str(a_file), "is a file")
    proc = mlhpc_cli(["run", "cosmoflow", "--out", "runs", "--seeds", "0"], tmp_path, 120)
    one_error_line(proc, "--seeds 0")
    assert not (tmp_path / "runs").exists()


def test_an_oserror_anywhere_is_one_line_unless_debugging(tmp_path: Path) -> None:
    write_log(tmp_path / "c" / "result_0.txt", 1, 2.0, 3)
    plot = f"{UNWRITABLE}/v.png"
    proc = mlhpc_cli(["variability", "c", "--plot", plot], tmp_path, 120)
    one_error_line(proc, "check that path")
    proc = mlhpc_cli(["variability", "c", "--plot", plot], tmp_path, 120, MLHPC_DEBUG="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize(
    ("sig", "code", "line"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_interrupt_and_terminate_are_one_line(
    tmp_path: Path, sig: signal.Signals, code: int, line: str
) -> None:
    # 50,000 mini samples are 2.1 GB: under the --allow-size line, and stopped long before the end.
    command = [sys.executable, "-m", "mlhpc", "generate", "cosmoflow", "--out", "d", "--samples", "50000"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    try:
        wait_for(lambda: any(p.is_dir() and any(p.iterdir()) for p in tmp_path.glob("d/.mlhpc-generating-*/train")), "d/.mlhpc-generating-*/train filled", 60, interval=0.05)  # generation writes there, moves up at the end
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert err.splitlines() == [f"mlhpc: {line}"], err[-2000:]


def test_variability_options_out_of_range(tmp_path: Path) -> None:
    proc = mlhpc_cli(["variability", ".", "--difference", "0"], tmp_path, 120)
    one_error_line(proc, "--difference 0", "positive")
    proc = mlhpc_cli(["variability", ".", "--confidence", "1.5"], tmp_path, 120)
    one_error_line(proc, "--confidence 1.5", "between 0 and 1")
