"""Shared fixtures: small generated CosmoFlow data, the mini config, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import settings

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.cli import mlhpc_cli
from tests.helpers.horovod_build import ci_order

# No per-example deadline for hypothesis: on a loaded machine an example's time says nothing about
# the code (speed is measured under perf/), and a deadline made CI fail at random (470 ms > 200 ms).
settings.register_profile("mlhpc", deadline=None)
settings.load_profile("mlhpc")

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




















@pytest.fixture
def run_mlhpc(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`mlhpc_cli` in this test's tmp_path."""

    def run(args: Sequence[str], timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        return mlhpc_cli(args, tmp_path, timeout, **env)

    return run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ci_order(items)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (with `--dist loadgroup`: a module marked `xdist_group` stays on one worker): one
    worker more than the CPUs, at most 6. Much of the suite waits (process
    starts, Slurm, the virtual cluster's links) rather than computes, so a third worker on two
    cores fills those waits; each worker brings up its own virtual cluster, hence the cap."""
    return min((os.cpu_count() or 1) + 1, 6)
