"""Issue 39, counts from outside: a count that starts local processes or threads is bounded by
this machine (`refuse_bad_counts`), in one line, before anything forks; `--instances` is bounded in
check_options (tests/campaign/test_job_strings_e2e.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.campaign.machine import RANKS_PER_CPU
from mlhpc.commands import MAX_THREADS, refuse_bad_counts
from mlhpc.common.cluster.threads import cpu_budget
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import cli_env


def test_process_and_thread_counts_are_bounded_by_the_machine() -> None:
    most = cpu_budget(look_s=0).cpus * RANKS_PER_CPU
    refuse_bad_counts("stage", {"--processes": most, "--workers": MAX_THREADS, "--chunk-mib": 10**6})
    with pytest.raises(
        ConfigError, match=rf"--processes {most + 1}: more than .* CPUs .*pass --processes {most}"
    ):
        refuse_bad_counts("stage", {"--processes": most + 1})
    with pytest.raises(ConfigError, match=f"pass --workers {MAX_THREADS} or fewer"):
        refuse_bad_counts("verify", {"--workers": MAX_THREADS + 1})
    with pytest.raises(ConfigError, match="at least 1"):
        refuse_bad_counts("verify", {"--workers": 0})


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["stage", "src", "dest", "--processes", "100000"], "--processes 100000"),
        (["verify", "dest", "--workers", "100000"], "--workers 100000"),
        (["manifest", "src", "--workers", "100000"], "--workers 100000"),
    ],
)
def test_the_cli_refuses_a_huge_count_in_one_line(tmp_path: Path, args: list[str], flag: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", *args],
        env=cli_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert flag in line and "or fewer" in line
    assert list(tmp_path.iterdir()) == []
