"""The GPU suite rehearsed as the lent GPU machine runs it: mlhpc installed non-editable with
`pip install --no-deps --target DIR`, the suite run from the repo root with PYTHONPATH=DIR and no
editable install in sight, in its CPU smoke mode.

The editable install is hidden honestly: python runs with -S, so no site directory is set up and no
.pth file runs (the editable finder is one); the venv's site-packages comes on PYTHONPATH, where
.pth files are not read, so torch and the rest import as on the image and `mlhpc` only from DIR.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "perf" / "gpu_suite.sh"


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A python that sees this venv's packages but not its editable mlhpc, and mlhpc installed
    into a folder with --target: the interpreter and the environment to run the suite with."""
    root = tmp_path_factory.mktemp("image")
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation"]
    # from a copy: pip's build/ and egg-info would otherwise be left in the checkout
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", ".whl", "runs"))
    subprocess.run(
        [*pip, "--no-compile", "--target", str(site), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    python = root / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPU_SUITE", "MLHPC_"))}
    env.update(
        PYTHON=str(python), PYTHONPATH=f"{site}:{sysconfig.get_paths()['purelib']}", TMPDIR=str(root / "tmp")
    )
    (root / "tmp").mkdir()
    return site, env


def run_suite(env: dict[str, str], out: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SUITE)],
        cwd=REPO,
        env={**env, "OUT": str(out), "GPU_SUITE_SMOKE": "1", **extra},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_editable_install_is_out_of_sight(
    image_python: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The control: from elsewhere, without DIR, this python cannot import mlhpc at all."""
    _, env = image_python
    env = {**env, "PYTHONPATH": env["PYTHONPATH"].split(":", 1)[1]}
    proc = subprocess.run([env["PYTHON"], "-c", "import mlhpc"], cwd=tmp_path, env=env, capture_output=True)
    assert proc.returncode != 0 and b"No module named 'mlhpc'" in proc.stderr


@pytest.mark.slow
def test_the_suite_runs_from_the_installed_copy_and_returns_flat_files(
    image_python: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    site, env = image_python
    out = tmp_path / "out"
    proc = run_suite(env, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (out / "gpu_suite.log").read_text()
    assert f"mlhpc from {site}/mlhpc/__init__.py" in log  # the installed copy, not the repo's folder
    files = sorted(p.name for p in out.iterdir())
    assert all((out / name).is_file() for name in files) and len(files) <= 6, files
    assert {"gpu_suite.md", "gpu_suite.log", "mini_result.txt", "mini_breakdown.json"} <= set(files)
    record = (out / "gpu_suite.md").read_text()
    for line in (
        "| cosmoflow | fp32 | no |",
        "| deepcam | fp32 | no |",
        "cosmoflow mini: success in 1 epochs",
    ):
        assert line in record
    assert "loader torch" in record and "loop overhead: " in record and "nccl: not run" in record
    assert "fp32 = " in record  # what fp32 means is said
    assert "characterize.json" in files and "characterize cosmoflow mini: step " in record
    assert "| 5. characterize cosmoflow mini, every level |" in record
    assert not list(Path(env["TMPDIR"]).glob("gpu_suite.*"))  # its temporary folder (data, --out) is gone


def test_a_failed_step_gives_a_non_zero_exit_after_the_record(
    image_python: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Step 1 forced to fail, and a 1-s budget: every other step is skipped, the record still written."""
    _, env = image_python
    out = tmp_path / "out"
    proc = run_suite(env, out, GPU_SUITE_FAIL_STEP="1", GPU_SUITE_BUDGET_S="1")
    assert proc.returncode == 1, proc.stderr[-4000:]
    record = (out / "gpu_suite.md").read_text()
    # Its seconds are whole ones from bash's SECONDS: 0, or 1 when the failing step crossed a second.
    assert re.search(r"\| 1\. training-step throughput, full-size models \| 300 \| [01] \| failed \(exit 3\) \|", record)
    assert "| 2. cosmoflow mini run to target through mlhpc run | 0 | 0 | skipped (no time left) |" in record
    assert "exit 1; record:" in proc.stderr
