"""Running mlhpc as a subprocess the way a user does (its environment, its command line), and what a
failed command must look like: one stderr line, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def said_lines(stderr: str) -> list[str]:
    """stderr's lines without the notice a slow step prints after 2 s (`mlhpc: checking X ...`,
    common/display/waiting.py): on a busy machine any check may print it, and it is no error."""
    return [
        line for line in stderr.splitlines() if not (line.startswith("mlhpc: ") and line.endswith(" ..."))
    ]


def one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a failed command, checked: exit 2, `mlhpc: error:`, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = said_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


REPO = Path(__file__).resolve().parents[2]


RUN_AND_TIME_INPUTS = (
    "BENCHMARK",
    "CONFIG",
    "SEED",
    "FIRST_SEED",
    "OUT",
    "DATA",
    "RUN_INDEX",
    "LAUNCHER",
    "EXTRA_ARGS",
    "MLHPC_CMD",
    "MLHPC_PYTHON",
    "DRY_RUN",
)
"""run_and_time.sh's environment inputs: a test of the script sets its own, never inherits them."""


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a `python -m mlhpc` subprocess: this venv first on PATH, no launcher vars."""
    launcher_prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MLHPC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_prefixes)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def mlhpc_cli(
    args: Sequence[str], root: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m mlhpc ARGS` in `root` in a subprocess (its own MLLOG state), staging under root/local."""
    return subprocess.run(
        [sys.executable, "-m", "mlhpc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(MLHPC_LOCAL_DIR=str(root / "local"), **env),
        cwd=root,
    )


def mlhpc(
    *args: str | Path, cwd: Path | None = None, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m mlhpc ARGS` to its end in a subprocess, output captured, in the test environment
    (`cli_env` with `env`); `mlhpc_cli` runs one in a folder of its own, staging under it."""
    return subprocess.run(
        [sys.executable, "-m", "mlhpc", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=cli_env(**env),
    )


def stage_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "mlhpc", "stage", *map(str, args)]
