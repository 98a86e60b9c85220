"""Signals always win (issue 31): a run with DataLoader workers stopped by its process group's
SIGTERM (a Slurm time limit, `scancel`) or SIGINT (Ctrl-C) exits 143 or 130 in one line, and a
FIFO in a dataset is refused in one line instead of blocking past every signal."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env
from tests.helpers.processes import ctrl_c_as_at_a_terminal

# Never reaches its target: the run is surely training when it is stopped.
ENDLESS = ("data.num_train_samples=512", "data.num_eval_samples=16", "loop.target=0.00001")


def _start(args: list[str], root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlhpc", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env=cli_env(OMP_NUM_THREADS="1"),
        start_new_session=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "code", "seed"), [(signal.SIGTERM, 143, 1), (signal.SIGINT, 130, 2)])
def test_a_group_signal_stops_a_run_with_dataloader_workers_quietly(
    tmp_path: Path, stop: signal.Signals, code: int, seed: int
) -> None:
    """Workers die of the same signal as the main process; torch's report of a killed worker must
    not replace the main process's own one line."""
    args = ["run", "cosmoflow", "--config", "mini", "--seeds", "1", "--first-seed", str(seed)]
    args += ["--out", str(tmp_path / "out"), "--local-dir", str(tmp_path / "local"), "--system", "ci"]
    proc = _start([*args, "--no-check", *ENDLESS, "data.num_workers=2"], tmp_path)
    deadline = time.monotonic() + 240
    while len(_children(proc.pid)) < 2:  # the workers start with the first training batch
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no DataLoader workers within 240 s"
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))  # a seeded point while they work
    assert proc.poll() is None, "the run ended before it could be stopped"
    os.killpg(proc.pid, stop)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    word = "terminated" if stop == signal.SIGTERM else "interrupted"
    assert stderr.splitlines()[-1].startswith(f"mlhpc: {word}"), stderr
