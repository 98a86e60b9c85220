"""`mlhpc run` prepares once (campaign/prepare.py): on every route (a run here, the dry run, the
Slurm submitter) the config is resolved once, the node-local folder found once, and a dataset
to generate size-checked once at most. Counted with a profiler on the functions themselves,
however a module imported them, in a real `mlhpc run` process (the toy benchmark registered)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.staging import MANIFEST_NAME, build_manifest
from tests.helpers.cli import cli_env

COUNTED_RUN = """
import json, sys
from mlhpc import cli, generation
from mlhpc.campaign import io
from mlhpc.common.contract import registry
from mlhpc.staging import localdir
from tests.helpers import toy_benchmark as toy

registry.register(toy.TOY)
watched = {
    io.resolve_config.__code__: "resolve_config",
    generation.run_size_check.__code__: "run_size_check",
    localdir.resolve_local_dir.__code__: "resolve_local_dir",
}
calls = []

def profile(frame, event, arg):
    if event == "call" and frame.f_code in watched:
        calls.append([watched[frame.f_code], frame.f_locals.get("config")])

sys.setprofile(profile)
try:
    status = cli.main(sys.argv[2:])
finally:
    sys.setprofile(None)
    with open(sys.argv[1], "w") as handle:
        json.dump({"status": status, "calls": calls}, handle)
"""

REACHABLE = "loop:\n  global_batch_size: 8\n  max_epochs: 20\n  target: 0.05\n"


def counted(tmp_path: Path, *argv: str) -> dict[str, list[str | None]]:
    """{function: the `config` argument of each call} over one `mlhpc run` that exits 0."""
    record = tmp_path / "calls.json"
    proc = subprocess.run(
        [sys.executable, "-c", COUNTED_RUN, str(record), "run", *argv],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, list[str | None]] = {}
    for name, config in json.loads(record.read_text())["calls"]:
        found.setdefault(name, []).append(config)
    return found


@pytest.fixture
def toy_data(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "sample.bin").write_bytes(b"x" * 100)
    build_manifest(src).write(src / MANIFEST_NAME)
    (tmp_path / "reachable.yaml").write_text(REACHABLE)
    return src


def test_a_run_here_prepares_once(tmp_path: Path, toy_data: Path) -> None:
    config = str(tmp_path / "reachable.yaml")
    common = ["--config", config, "--data", str(toy_data), "--local-dir", str(tmp_path / "local")]
    found = counted(tmp_path, "toy", *common, "--seeds", "1", "--out", str(tmp_path / "out"), "--no-check")
    assert found == {"resolve_config": [config], "resolve_local_dir": [None]}  # --data: no size check
    assert list((tmp_path / "out").rglob("result_0.txt")), "the run trained and wrote its log"


def test_the_dry_run_of_a_run_that_generates_prepares_once(tmp_path: Path, toy_data: Path) -> None:
    found = counted(tmp_path, "toy", "--config", str(tmp_path / "reachable.yaml"), "--dry-run", "--out", str(tmp_path))
    assert found["resolve_config"].count(str(tmp_path / "reachable.yaml")) == 1, found
    assert len(found["run_size_check"]) == 1 and len(found["resolve_local_dir"]) == 1, found


def test_a_slurm_submission_prepares_once(tmp_path: Path) -> None:
    found = counted(tmp_path, "cosmoflow", "--slurm", "--dry-run", "--seeds", "2", "--out", str(tmp_path / "o"))
    assert found == {"resolve_config": ["mini"], "run_size_check": ["mini"], "resolve_local_dir": [None]}
