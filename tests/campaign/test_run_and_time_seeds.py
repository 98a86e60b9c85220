"""run_and_time.sh by hand, for real: mlhpc's planner gives each run's seed (from FIRST_SEED, else
from the campaign file), mlhpc writes it back, and the RESULT line names the seed the result log
ran. The script draws no seed and works none out (issue 32)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.campaign.seeds import seed_of
from tests.helpers.cli import cli_env
from tests.helpers.mllog_files import mllog_events

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# One short epoch whose first evaluation meets the target: the run ends with status success.
QUICK = "data.num_train_samples=64 data.num_eval_samples=16 loop.max_epochs=1 loop.target=2.0"


def run_and_time(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    variables = cli_env(
        OUT=str(tmp_path / "out"),
        MLHPC_LOCAL_DIR=str(tmp_path / "local"),
        MLHPC_CMD=f"{sys.executable} -m mlhpc",
        EXTRA_ARGS=f"--system ci {QUICK}",
        OMP_NUM_THREADS="1",
        **env,
    )
    for name in ("SEED", "FIRST_SEED", "RUN_INDEX", "LAUNCHER", "DATA", "DRY_RUN"):
        variables.setdefault(name, "")
        if not env.get(name):
            variables.pop(name)
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run(
        [bash, str(REPO / "run_and_time.sh")],
        env=variables,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def result_seed(stdout: str) -> int:
    (line,) = re.findall(r"^RESULT,cosmoflow,(\d+),\d+,", stdout, re.MULTILINE)
    return int(line)


def logged_seed(log: Path) -> int:
    return next(e["value"] for e in mllog_events(log) if e["key"] == "seed")


def test_the_result_line_names_the_seed_the_planner_gave(tmp_path: Path) -> None:
    results = tmp_path / "out" / "mlhpc" / "results" / "ci" / "strong" / "cosmoflow"
    first = run_and_time(tmp_path, RUN_INDEX="2", FIRST_SEED="41")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert result_seed(first.stdout) == logged_seed(results / "result_2.txt") == seed_of(41, 2)
    campaign = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert campaign["entries"]["cosmoflow/strong"]["first_seed"] == 41

    # No FIRST_SEED: the campaign file's first seed, the planner's seed for index 0.
    second = run_and_time(tmp_path, RUN_INDEX="0")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert result_seed(second.stdout) == logged_seed(results / "result_0.txt") == seed_of(41, 0)
    # The seed files mlhpc wrote back stay (the script removes no file), each holding its run's seed.
    left = sorted(p.read_text() for p in (tmp_path / "out" / ".mlhpc-runs").glob("run_and_time-*.seed"))
    assert left == sorted(f"{seed_of(41, i)}\n" for i in (2, 0))

    # A FIRST_SEED the campaign file contradicts: refused by the planner, no RESULT line.
    third = run_and_time(tmp_path, RUN_INDEX="1", FIRST_SEED="7")
    assert third.returncode == 2 and "RESULT," not in third.stdout
    assert "first seed is 41, not --first-seed 7" in third.stderr
