"""What the cluster tests' runs share: the synthetic CosmoFlow sets they train on and how a
finished run's MLLOG is judged (tests/cluster/)."""

from __future__ import annotations

from pathlib import Path

from mlhpc.benchmarks.cosmoflow import data as cosmo_data_module
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.mllog_files import mllog_events

# A launcher test needs the ranks to train and evaluate together, not a converged model: with a
# target the first evaluation meets, one epoch (16 steps) ends the run with status success.
QUICK = ["data.num_train_samples=256", "data.num_eval_samples=32", "loop.max_epochs=2", "loop.target=2.0"]
# Checked runs keep the real target (MAE 0.124): 4-7 epochs of 1,024 samples on these seeds.
TO_TARGET = ["data.num_train_samples=1024", "data.num_eval_samples=64", "loop.max_epochs=20"]


def dataset(root: Path, overrides: list[str]) -> Path:
    """The synthetic CosmoFlow set `overrides` ask for, with its manifest, on the shared disk."""
    from mlhpc.staging import build_manifest
    from mlhpc.staging.manifest import MANIFEST_NAME

    cfg = load_config(CosmoFlowConfig, registry.get("cosmoflow").config_path("mini"), overrides)
    cosmo_data_module.generate(cfg, root, seed=3)
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def value(events: list[dict], key: str) -> object:
    return next(e["value"] for e in events if e["key"] == key)


def assert_success(log: Path, seed: int | None, nodes: int) -> list[dict]:
    """The run in `log` ended with status success, with `seed` (None: the one the planner drew)
    on `nodes` nodes; its MLLOG events."""
    events = mllog_events(log)
    stop = next(e for e in events if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success", (log, stop)
    assert seed is None or value(events, "seed") == seed
    assert value(events, "number_of_nodes") == nodes, log
    return events
