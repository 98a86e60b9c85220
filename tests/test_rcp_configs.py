"""Every RCP reference in the installed mlperf_logging has a config that trains what the run behind
it trained, and logs its hyperparameters as that run logged them.

The RCP JSON is read from the installed package (never a copy): a new mlperf-logging release with a
new reference, batch size or key fails here until a config matches it. Where the JSON differs from
the reference run's code and logs, JSON_DIFFERS names the key, both values and why.
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


JSON_DIFFERS = {
    # The HPC rules define opt_base_learning_rate as the peak (scaled) LR and every CosmoFlow reference
    # run logged the peak; these two JSON entries hold the initial (unscaled) LR instead.
    ("cosmoflow_ref_32", "opt_base_learning_rate"): (
        0.004,
        0.001,
    ),  # NVIDIA PyTorch v2.0: logs lr, not init_lr
    ("cosmoflow_ref_512", "opt_base_learning_rate"): (0.024, 0.006),  # Fujitsu's logs show 0.024
}
"""(RCP name, key): (what we log, as the reference run logged it; what the JSON holds)."""


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
        if (name, key) in JSON_DIFFERS:
            run_logged, json_holds = JSON_DIFFERS[name, key]
            assert same(reference, json_holds), f"{name}: the JSON's {key} changed; revisit JSON_DIFFERS"
            reference = run_logged
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


def _expand(points: list[tuple[int, float]], epochs: int = 128) -> list[float]:
    """A per-epoch LR list (index 0 = epoch_num 1) from (first epoch_num, LR) change points."""
    lrs = []
    for epoch_num in range(1, epochs + 1):
        lrs.append(max((p for p in points if p[0] <= epoch_num), key=lambda p: p[0])[1])
    return lrs


# The LR each reference run trained at, epoch by epoch (epoch_num: LR from then on), worked out from
# its code: i = epoch_num - 1 is the epoch index the code sees; warm-up is stepped once an epoch.
REFERENCE_LR = {
    # mlcommons/hpc TF reference, cosmoflow/utils/optimizers.py `_lr_schedule`: warm-up for i < 4
    # from base 0.001 to peak 0.001 (x1 at batch 64); factor d of boundary b once b < i (epoch_num
    # b+2), absolute on the peak: {16: 0.25, 32: 0.125} (the TF code logs max() = 0.25).
    64: _expand([(1, 0.001), (18, 0.00025), (34, 0.000125)]),
    # NVIDIA MXNet v1.0 train.py `LRScheduler`: current_epoch = i; initial 0.001 + (0.004 - 0.001) i / 4
    # for i < 4; then peak 0.004 x d once b < i: drop_steps (16, 0.25), (32, 0.125).
    128: _expand(
        [(1, 0.001), (2, 0.00175), (3, 0.0025), (4, 0.00325), (5, 0.004), (18, 0.001), (34, 0.0005)]
    ),
    # mlcommons/hpc TF reference at batch 1024: 0.012 from the start (no warm-up), {32: 0.25, 64: 0.125}.
    1024: _expand([(1, 0.012), (34, 0.003), (66, 0.0015)]),
    # NVIDIA PyTorch v2.0 optimizer.py `LRSchedulerCalculator` (stepped once an epoch, trainer.py):
    # init_lr 0.001 x (1 + 3 i / 2) for i < 2, then lr 0.004 x d once b <= i (epoch_num b+1):
    # decay_steps [4, 6], decay_values [0.25, 0.0625].
    32: _expand([(1, 0.001), (2, 0.0025), (3, 0.004), (5, 0.001), (7, 0.00025)]),
    # Fujitsu's TF implementation (the mlcommons/hpc `_lr_schedule`): 0.006 + 0.018 i / 6 for i < 6,
    # then 0.024 x d once b < i: {19: 0.5, 21: 0.25, 22: 0.125, 23: 0.0625}.
    512: _expand(
        [
            (1, 0.006),
            (2, 0.009),
            (3, 0.012),
            (4, 0.015),
            (5, 0.018),
            (6, 0.021),
            (7, 0.024),
            (21, 0.012),
            (23, 0.006),
            (24, 0.003),
            (25, 0.0015),
        ]
    ),
}
REFERENCE_GRADIENT_WEIGHT_DECAY = {64: 0.02, 128: 0.0, 1024: 0.0, 32: 0.0, 512: 0.02}
"""Keras l2(0.01) on the hidden dense kernels adds 0.02 w to their gradient (TF reference, Fujitsu)."""


def cosmo_references() -> list[int]:
    return [record["BS"] for bench, _, record in references() if bench == "cosmoflow"]


def test_every_cosmoflow_reference_has_a_reference_schedule() -> None:
    assert sorted(cosmo_references()) == sorted(REFERENCE_LR)


@pytest.mark.parametrize("batch", sorted(REFERENCE_LR))
def test_cosmoflow_rcp_trains_the_reference_schedule(batch: int) -> None:
    """The whole per-epoch LR, through the real LambdaLR stepped per optimizer step (3 an epoch)."""
    from mlhpc.benchmarks.cosmoflow import model, train

    bench = registry.get("cosmoflow")
    cfg = load_config(bench.config_class, bench.config_path(f"rcp_{batch}"))
    expected = REFERENCE_LR[batch]
    assert train.learning_rate_per_epoch(cfg) == pytest.approx(expected, rel=1e-12)
    small = load_config(
        bench.config_class,
        bench.config_path(f"rcp_{batch}"),
        ["data.sample_size=16", "model.base_filters=1"],
    )
    net = model.build_model(small)
    optimizer, scheduler = train.build_optimizer(small, net, init_distributed("auto", "cpu"), 3)
    seen = []
    for _ in range(cfg.loop.max_epochs):
        seen.append(optimizer.param_groups[0]["lr"])
        for _ in range(3):
            optimizer.step()
            scheduler.step()
    assert seen == pytest.approx(expected, rel=1e-12)
    decays = {group["weight_decay"] for group in optimizer.param_groups if group["weight_decay"]}
    assert decays <= {REFERENCE_GRADIENT_WEIGHT_DECAY[batch]}
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(REFERENCE_GRADIENT_WEIGHT_DECAY[batch])
    assert isinstance(optimizer, train.VelocitySGD)  # every reference puts the LR in the velocity
