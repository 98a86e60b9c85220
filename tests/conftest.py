"""Shared fixtures: small generated CosmoFlow data, the mini config, and a CLI runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["tests.helpers.vcluster_fixture"]  # the session's virtual Slurm cluster (fixture `vcluster`)


@pytest.fixture
def cosmo_cfg() -> Callable[..., CosmoFlowConfig]:
    """Factory: the packaged mini config with `key=value` overrides."""

    def make(*overrides: str, name: str = "mini") -> CosmoFlowConfig:
        bench = registry.get("cosmoflow")
        return load_config(CosmoFlowConfig, bench.config_path(name), overrides)

    return make


@pytest.fixture(scope="session")
def cosmo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CosmoFlow dataset in the real format (32 train, 8 validation samples of 16^3 x 4)."""
    from mlhpc.benchmarks.cosmoflow import data
    from mlhpc.staging import build_manifest
    from mlhpc.staging.manifest import MANIFEST_NAME

    bench = registry.get("cosmoflow")
    cfg = load_config(
        CosmoFlowConfig, bench.config_path("mini"), ["data.num_train_samples=32", "data.num_eval_samples=8"]
    )
    root = tmp_path_factory.mktemp("cosmo") / "data"
    data.generate(cfg, root, seed=1)
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def dataset_files(root: Path) -> dict[str, bytes]:
    """A dataset's files by relative path (bytes), without manifests and staging bookkeeping."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.name != "mlhpc_manifest.json"
    }


def official_compliance(
    log: Path, ruleset: str = "3.0.0", rules: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The official checker as its README runs it (HPC usage); `rules` is our own rule file for a
    benchmark mlperf_logging has none for (the engine needs it as an absolute path)."""
    scratch = Path(tempfile.mkdtemp(prefix="compliance-"))  # its log goes here, not beside the result
    command = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        "hpc",
        "--ruleset",
        ruleset,
    ]
    command += ["--log_output", str(scratch / "compliance.log")]
    if rules is not None:
        command += ["--config", str(Path(rules).resolve())]
    return subprocess.run(
        [*command, str(log)], capture_output=True, text=True, timeout=120, env=cli_env(), cwd=scratch
    )


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


_HOLD_LOCK = """
import sys
from pathlib import Path
from mlhpc.common.safeio.locks import folder_lock
with folder_lock(Path(sys.argv[1]), "a test's hold", "let the test go on"):
    print("held", flush=True)
    sys.stdin.read()
"""


def lock_held_elsewhere(folder: Path) -> AbstractContextManager[int]:
    """`folder`'s mlhpc lock held by another process for the block; yields that process's pid."""
    return held_by_another_process(_HOLD_LOCK, str(folder))


def ctrl_c_as_at_a_terminal() -> None:
    """Popen's preexec_fn for a child a test Ctrl-C's: SIGINT back to its default. A job started
    in the background of a non-interactive shell (`.ci/run &`, nohup) inherits SIGINT ignored,
    and Python then never raises KeyboardInterrupt: the child would run on, as if never stopped."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def held_by_another_process(script: str, *args: str) -> Iterator[int]:
    """Runs `script` (which prints "held" once it holds something, then waits on stdin) in another
    process for the block; yields its pid, and lets it go at the end."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.communicate("")


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


@pytest.fixture
def run_mlhpc(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`mlhpc_cli` in this test's tmp_path."""

    def run(args: Sequence[str], timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        return mlhpc_cli(args, tmp_path, timeout, **env)

    return run


def mllog_events(path: Path) -> list[dict]:
    """The decoded `:::MLLOG` records of a log (or of captured output with other lines around them)."""
    lines = path.read_text().splitlines()
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in lines if ":::MLLOG" in line]
