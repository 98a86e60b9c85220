"""run_and_time.sh when the run cannot start or fails: one line, its exit status, never a RESULT line.

A RESULT line is read as a time to train, so a run that never started (the launcher is not on
PATH, as when the venv is not activated) or that failed must not print one. Every case runs the
real script in a real bash; the launchers are real programs on a PATH the test builds.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import RUN_AND_TIME_INPUTS, cli_env

REPO = Path(__file__).resolve().parents[2]
RUN_AND_TIME = REPO / "run_and_time.sh"
BASH = shutil.which("bash") or "/bin/bash"
RESULT = re.compile(r"^RESULT,", re.MULTILINE)


def script_env(path: str, **extra: str) -> dict[str, str]:
    """cli_env with PATH replaced and none of the script's inputs inherited from the caller."""
    env = {k: v for k, v in cli_env().items() if k not in RUN_AND_TIME_INPUTS}
    env["PATH"] = path
    env.update(extra)
    return env


def run(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(RUN_AND_TIME)], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def launcher_exiting_with(folder: Path) -> Path:
    """A real program that stands for the launcher and mlhpc: it writes $WRITE_SEED (when set) to
    the file after --seed-file, as mlhpc's rank 0 does, and exits with $EXIT_WITH."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "fake-launcher"
    program.write_text(
        "#!/bin/sh\n"
        'echo "launched: $*"\n'
        "while [ $# -gt 1 ]; do\n"
        '    if [ "$1" = --seed-file ] && [ -n "$WRITE_SEED" ]; then mkdir -p "${2%/*}"; echo "$WRITE_SEED" > "$2"; fi\n'
        "    shift\n"
        "done\n"
        'exit "$EXIT_WITH"\n'
    )
    program.chmod(0o755)
    return program


def system_path(tmp_path: Path) -> str:
    """A PATH holding only what the script and the stand-in launcher need (`date`, `id`, `sh`,
    `mkdir`), and no torchrun or mlhpc."""
    folder = tmp_path / "sysbin"
    folder.mkdir(exist_ok=True)
    for name in ("date", "id", "sh", "mkdir"):
        found = shutil.which(name)
        assert found, f"{name} is not installed"
        target = folder / name
        if not target.exists():
            target.symlink_to(found)
    return str(folder)


def test_the_documented_torchrun_example_without_the_venv_is_one_line(tmp_path: Path) -> None:
    """docs/RUNNING.md's example in a shell where the venv is not active: before, bash said
    `torchrun: command not found` (exit 127) and the script still printed a RESULT line."""
    env = script_env(system_path(tmp_path), OUT="runs/c", LAUNCHER="torchrun --standalone --nproc_per_node=2")
    proc = run(env, tmp_path)
    assert proc.returncode == 127, proc.stdout + proc.stderr
    assert not RESULT.search(proc.stdout), proc.stdout
    assert "STARTING TIMING RUN" not in proc.stdout, "nothing should have started"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "torchrun is not on PATH" in lines[0] and ". .venv/bin/activate" in lines[0]
    assert "LAUNCHER" in lines[0]
    assert not (tmp_path / "runs").exists(), "a run that never started wrote its --out"


def test_a_missing_mlhpc_command_is_one_line(tmp_path: Path) -> None:
    env = script_env(system_path(tmp_path), OUT="runs/c", MLHPC_CMD="/no/such/venv/bin/mlhpc")
    proc = run(env, tmp_path)
    assert proc.returncode == 127
    assert not RESULT.search(proc.stdout)
    assert proc.stderr.strip().splitlines() == [
        "run_and_time.sh: /no/such/venv/bin/mlhpc is not on PATH; activate the venv "
        "(. .venv/bin/activate) or give MLHPC_CMD its full path"
    ]


@pytest.mark.parametrize("status", [1, 2, 3, 124, 130, 137])
def test_a_failed_run_passes_its_status_on_and_prints_no_result(tmp_path: Path, status: int) -> None:
    launcher = launcher_exiting_with(tmp_path / "bin")
    env = script_env(system_path(tmp_path), RUN_INDEX="3", OUT="runs/c", LAUNCHER=str(launcher))
    env["EXIT_WITH"] = str(status)
    proc = run(env, tmp_path)
    assert proc.returncode == status
    assert "launched: " in proc.stdout, "the launcher did not run"
    assert "ENDING TIMING RUN AT" in proc.stdout and f"(exit status {status})" in proc.stdout
    assert not RESULT.search(proc.stdout), proc.stdout
    assert f"the run of index 3 failed (exit status {status}); no RESULT line" in proc.stderr


def test_a_run_that_succeeds_prints_the_seed_mlhpc_wrote_back(tmp_path: Path) -> None:
    """The seed is mlhpc's planner's: the script passes --index and FIRST_SEED on, never works a
    seed out, and prints in RESULT the one the run wrote to its --seed-file (which it leaves)."""
    launcher = launcher_exiting_with(tmp_path / "bin")
    env = script_env(
        system_path(tmp_path), RUN_INDEX="2", FIRST_SEED="9", OUT="runs/c", LAUNCHER=str(launcher)
    )
    env.update(EXIT_WITH="0", WRITE_SEED="11")
    proc = run(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    launched = proc.stdout.split("launched: ", 1)[1].splitlines()[0].split()
    assert (
        launched[launched.index("--index") + 1] == "2" and launched[launched.index("--first-seed") + 1] == "9"
    )
    seed_file = Path(launched[launched.index("--seed-file") + 1])
    assert seed_file.parent == Path("runs/c/.mlhpc-runs") and seed_file.suffix == ".seed"
    assert (tmp_path / seed_file).read_text() == "11\n", "the seed file stays: the script removes no file"
    results = RESULT.findall(proc.stdout)
    assert len(results) == 1
    assert re.search(r"^RESULT,cosmoflow,11,\d+,[^,]+,.+$", proc.stdout, re.MULTILINE), proc.stdout
    assert "no RESULT line" not in proc.stderr


def test_a_run_that_wrote_no_seed_prints_no_result(tmp_path: Path) -> None:
    """Rank 0 on a node that does not share OUT: the run ended, but its seed is unknown."""
    launcher = launcher_exiting_with(tmp_path / "bin")
    env = script_env(system_path(tmp_path), OUT="runs/c", LAUNCHER=str(launcher), EXIT_WITH="0")
    proc = run(env, tmp_path)
    assert proc.returncode == 1 and not RESULT.search(proc.stdout), proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "mlhpc wrote no seed to runs/c/.mlhpc-runs/" in line and "OUT must be shared" in line


def test_a_seed_by_hand_is_refused_in_one_line(tmp_path: Path) -> None:
    """SEED is the planner's (a --slurm seed job's); by hand the script would have to work out the
    campaign's first seed from it, which it never does."""
    env = script_env(system_path(tmp_path), SEED="11", RUN_INDEX="2", OUT="runs/c", MLHPC_CMD="/bin/true")
    proc = run(env, tmp_path)
    assert proc.returncode == 2 and "STARTING" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "SEED=11" in line and "set FIRST_SEED" in line


def test_a_real_mlhpc_refusal_prints_no_result(tmp_path: Path) -> None:
    """mlhpc itself exits 2 (an unknown config key): that status comes back, with no RESULT."""
    venv_bin = str(Path(sys.executable).parent)
    env = script_env(
        f"{venv_bin}{os.pathsep}{system_path(tmp_path)}",
        OUT=str(tmp_path / "out"),
        MLHPC_CMD=f"{sys.executable} -m mlhpc",
        EXTRA_ARGS="loop.no_such_key=1",
    )
    proc = run(env, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no_such_key" in proc.stderr
    assert not RESULT.search(proc.stdout), proc.stdout
    assert "the run of index 0 failed (exit status 2); no RESULT line" in proc.stderr


@pytest.mark.parametrize("name", ["EXTRA_ARGS", "LAUNCHER", "MLHPC_CMD", "MLHPC_PYTHON"])
def test_a_variable_with_a_second_line_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """`read` took the first line of EXTRA_ARGS and dropped the rest unseen (issue 39)."""
    launcher = launcher_exiting_with(tmp_path / "bin")
    env = script_env(system_path(tmp_path), OUT="runs/c", LAUNCHER=str(launcher), EXIT_WITH="0")
    env[name] = env.get(name, "") + "x=1\nloop.max_epochs=2"
    proc = run(env, tmp_path)
    assert proc.returncode == 2 and "STARTING" not in proc.stdout, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert name in line and "newline" in line


@pytest.mark.parametrize("host", ["../../escaped", "/etc/x", "a b\tc", "..", "é" * 200])
def test_the_seed_file_stays_in_out_whatever_the_host_is_called(tmp_path: Path, host: str) -> None:
    """The seed file's name took $HOSTNAME as it was: `..` and `/` led out of OUT/.mlhpc-runs."""
    launcher = launcher_exiting_with(tmp_path / "bin")
    env = script_env(system_path(tmp_path), OUT="runs/c", LAUNCHER=str(launcher), HOSTNAME=host)
    env.update(EXIT_WITH="0", WRITE_SEED="11")
    proc = run(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    launched = proc.stdout.split("launched: ", 1)[1].splitlines()[0].split()
    seed_file = Path(launched[launched.index("--seed-file") + 1])
    assert seed_file.parent == Path("runs/c/.mlhpc-runs"), seed_file
    assert len(seed_file.name) < 200 and all(c.isascii() for c in seed_file.name)
    assert [p.name for p in (tmp_path / "runs/c/.mlhpc-runs").iterdir()] == [seed_file.name]


def test_mlhpc_python_is_one_path_and_mlhpc_cmd_says_where_a_spaced_one_goes(tmp_path: Path) -> None:
    spaced = tmp_path / "my venv" / "bin"
    program = launcher_exiting_with(spaced)
    env = script_env(system_path(tmp_path), OUT="runs/c", MLHPC_PYTHON=str(program), DRY_RUN="1")
    proc = run(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert shlex.split(proc.stdout)[:3] == [str(program), "-m", "mlhpc"]
    env = script_env(system_path(tmp_path), OUT="runs/c", MLHPC_CMD=f"{program} -m mlhpc")
    proc = run(env, tmp_path)
    assert proc.returncode == 127
    (line,) = proc.stderr.strip().splitlines()
    assert "MLHPC_CMD is split on spaces" in line and "MLHPC_PYTHON" in line
