"""Every RCP reference in the installed mlperf_logging has a config that logs its hyperparameters.

The RCP JSON is read from the installed package (never a copy): a new mlperf-logging release with a
new reference, batch size or key fails here until a config matches it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlperf_logging
import pytest

from mlhpc.common import registry
from mlhpc.common.config import load_config
from mlhpc.common.distributed import init_distributed

RCP_DIR = Path(mlperf_logging.__file__).parent / "rcp_checker" / "hpc_3.0.0"
BENCHMARKS = ("cosmoflow", "deepcam")
KEY_SPELLINGS = {"batchnorm_groupsize": "batchnorm_group_size"}
"""The RCP file's spelling of a key, and the key the compliance rules require (and we log)."""


def references() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for benchmark in BENCHMARKS:
        path = RCP_DIR / f"rcps_{benchmark}.json"
        for name, record in json.loads(path.read_text()).items():
            found.append((benchmark, name, record))
    return found


def same(logged: Any, reference: Any) -> bool:
    """Equal, reading the RCP file's numbers written as strings ("0.1", "9000") as numbers."""
    if isinstance(reference, str) and not isinstance(logged, str):
        try:
            reference = float(reference)
        except ValueError:
            return False
    if isinstance(reference, list) and isinstance(logged, list):
        return len(reference) == len(logged) and all(
            same(a, b) for a, b in zip(logged, reference, strict=True)
        )
    if isinstance(reference, (int, float)) and isinstance(logged, (int, float)):
        return logged == pytest.approx(reference, rel=1e-12, abs=0)
    return logged == reference


def test_the_installed_rcp_files_hold_references() -> None:
    counts = {b: sum(1 for r in references() if r[0] == b) for b in BENCHMARKS}
    assert all(count >= 1 for count in counts.values()), (RCP_DIR, counts)


@pytest.mark.parametrize(
    ("benchmark", "name", "record"), references(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_rcp_config_logs_the_reference_hyperparameters(benchmark: str, name: str, record: dict) -> None:
    bench = registry.get(benchmark)
    batch = record["BS"]
    config = bench.configs_dir / f"rcp_{batch}.yaml"
    assert config.is_file(), f"{name}: no config rcp_{batch}.yaml for the RCP at batch {batch}"
    cfg = load_config(bench.config_class, config)
    logged = bench.hyperparameters(cfg, init_distributed("auto", "cpu"))
    assert cfg.loop.global_batch_size == batch
    wrong = {}
    for key, reference in record["Hyperparams"].items():
        ours = KEY_SPELLINGS.get(key, key)
        if ours not in logged:
            wrong[key] = ("not logged", reference)
        elif not same(logged[ours], reference):
            wrong[key] = (logged[ours], reference)
    assert not wrong, f"{name} (ours, the RCP's): {wrong}"


@pytest.mark.parametrize(("benchmark", "batch"), [("cosmoflow", 64), ("deepcam", 2048)])
def test_full_is_the_default_reference(benchmark: str, batch: int) -> None:
    bench = registry.get(benchmark)
    ctx = init_distributed("auto", "cpu")
    full = load_config(bench.config_class, bench.config_path("full"))
    rcp = load_config(bench.config_class, bench.config_path(f"rcp_{batch}"))
    assert full == rcp
    assert bench.hyperparameters(full, ctx) == bench.hyperparameters(rcp, ctx)
