"""Every RCP reference in the installed mlperf_logging has a config that trains what the run behind
it trained, and logs its hyperparameters as that run logged them.

The RCP JSON is read from the installed package (never a copy): a new mlperf-logging release with a
new reference, batch size or key fails here until a config matches it. Where the JSON differs from
the reference run's code and logs, JSON_DIFFERS and JSON_ONE_FACTOR name the key, both values and
why. The CosmoFlow runs' own logs and configs are excerpted in tests/data/cosmoflow_rcp_sources/
(NOTICE.md there names each source) and in tests/data/hpc_v2.0_helmholtzai/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlperf_logging
import pytest
import yaml

from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.cosmoflow_lr import learning_rate_per_epoch
from tests.helpers.rcp_references import REFERENCE_GRADIENT_WEIGHT_DECAY, REFERENCE_LR

RCP_DIR = Path(mlperf_logging.__file__).parent / "rcp_checker" / "hpc_3.0.0"
BENCHMARKS = ("cosmoflow", "deepcam")
KEY_SPELLINGS = {"batchnorm_groupsize": "batchnorm_group_size"}
"""The RCP file's spelling of a key, and the key the compliance rules require (and we log)."""
DATA = Path(__file__).parents[1] / "data"
SOURCES = DATA / "cosmoflow_rcp_sources"
HELMHOLTZ_512 = DATA / "hpc_v2.0_helmholtzai/HelmholtzAI/results/horeka_gpu_n512_pytorch1.13/strong/cosmoflow"

# Who made each CosmoFlow RCP (mlcommons/logging history of rcp_checker/hpc_*/rcps_cosmoflow.json):
#   ref_64   #151, 2021-09: LBNL's runs of the mlcommons/hpc TF reference (configs/cosmo_rcp_64.yaml
#            and scripts/submit_rcp_64.sh of sparticlesteve/cosmoflow-benchmark @ bec82d1, Cori-GPU).
#   ref_128, ref_1024  #174, 2021-10, NVIDIA: the hyperparameters of NVIDIA's MXNet v1.0 submissions
#            (hpc_results_v1.0 NVIDIA/benchmarks/cosmoflow/implementations/mxnet, configs
#            config_DGXA100_16x8x1.sh and _128x8x1.sh; their logs are excerpted here). ref_1024 replaced
#            LBNL's TF run (0.016 after 4 warm-up epochs, dropout 0, l2 0.01).
#   ref_512  #187, 2021-10, Fujitsu, for HPC v1.0: Fujitsu's TF code on Fugaku (hpc_results_v1.0
#            Fujitsu+RIKEN/.../implementation_fugaku/cosmoflow-benchmark, configs/cosmo_closed_512.yaml;
#            the v2.0 repository holds the same files). Not from v2.0.
#   ref_32   2022-09, NVIDIA: NVIDIA's PyTorch v2.0 code (configs/submission_dgxa100_4x8x1.yaml).
JSON_DIFFERS = {
    # The HPC rules define opt_base_learning_rate as the peak (scaled) LR and every CosmoFlow reference
    # run logged the peak; these two JSON entries hold the initial (unscaled) LR instead.
    ("cosmoflow_ref_32", "opt_base_learning_rate"): (0.004, 0.001, "nvidia_v2.0_pytorch_bs32_result_002.txt"),
    ("cosmoflow_ref_512", "opt_base_learning_rate"): (0.024, 0.006, "fujitsu_v1.0_tf_bs512_result_1.txt"),
}
"""(RCP name, key): (what we log, as the run logged it; what the JSON holds; the run's log excerpt)."""

JSON_ONE_FACTOR = {
    # The TF reference logs opt_learning_rate_decay_factor as max(factors); these JSON entries hold that
    # one number, the runs trained with two. We log the JSON's form; the configs train both factors.
    "cosmoflow_ref_64": (0.25, 0.125),  # lbnl_cosmo_rcp_64.yaml: decay_schedule {16: 0.25, 32: 0.125}
    "cosmoflow_ref_128": (0.25, 0.125),  # NVIDIA's MXNet run logged [0.25, 0.125]
    "cosmoflow_ref_1024": (0.25, 0.125),  # NVIDIA's MXNet run logged [0.25, 0.125]
}
"""RCP name: the decay factors the run trained with, where the JSON holds only the largest."""


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
            run_logged, json_holds, _ = JSON_DIFFERS[name, key]
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





RUN_LOGS = {
    32: ("nvidia_v2.0_pytorch_bs32_result_002.txt", 1.0),
    128: ("nvidia_v1.0_mxnet_bs128_result_1.txt", 1.0),
    512: ("fujitsu_v1.0_tf_bs512_result_1.txt", 2.0),
    1024: ("nvidia_v1.0_mxnet_bs1024_result_1.txt", 1.0),
}
"""Batch: (the run's log excerpt, the gradient weight decay per unit of the logged opt_weight_decay)."""


def mllog(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in lines if ":::MLLOG" in line]


def logged_keys(path: Path) -> dict[str, Any]:
    return {e["key"]: e["value"] for e in mllog(path) if e["event_type"] == "POINT_IN_TIME"}


def logged_lr(path: Path) -> dict[int, float]:
    """epoch_num: the LR NVIDIA's PyTorch trainer logged at that epoch's start (one per param group)."""
    found = {}
    for event in mllog(path):
        if event["key"] == "epoch_start":
            groups = set(event["metadata"]["lr"])
            assert len(groups) == 1, (path, event)
            found[event["metadata"]["epoch_num"]] = groups.pop()
    return found


def rcp_config(batch: int, overrides: list[str] | None = None) -> Any:
    bench = registry.get("cosmoflow")
    return load_config(bench.config_class, bench.config_path(f"rcp_{batch}"), overrides or [])


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
    assert learning_rate_per_epoch(cfg) == pytest.approx(expected, rel=1e-12)
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


@pytest.mark.parametrize("batch", sorted(RUN_LOGS))
def test_the_run_behind_each_rcp_logged_what_its_config_trains(batch: int) -> None:
    from mlhpc.benchmarks.cosmoflow import train

    name, decay_per_logged_unit = RUN_LOGS[batch]
    run = logged_keys(SOURCES / name)
    cfg = rcp_config(batch)
    opt = cfg.optimizer
    assert run["global_batch_size"] == batch == cfg.loop.global_batch_size
    assert run["opt_base_learning_rate"] == pytest.approx(train.scaled_learning_rate(cfg), rel=1e-12)
    assert run["opt_learning_rate_warmup_epochs"] == opt.warmup_epochs
    if opt.warmup_epochs:  # NVIDIA's MXNet logs int(lr / init_lr) = 12 at batch 1024 with no warm-up
        assert run["opt_learning_rate_warmup_factor"] == train.warmup_factor(cfg)
    assert run["opt_learning_rate_decay_boundary_epochs"] == list(opt.decay_boundary_epochs)
    factors = run["opt_learning_rate_decay_factor"]  # NVIDIA logs the list, Fujitsu (as TF) the max
    assert factors == (list(opt.decay_factors) if isinstance(factors, list) else max(opt.decay_factors))
    assert run["dropout"] == cfg.model.dropout
    gradient_decay = run["opt_weight_decay"] * decay_per_logged_unit
    assert gradient_decay == opt.gradient_weight_decay() == REFERENCE_GRADIENT_WEIGHT_DECAY[batch]
    assert opt.momentum == 0.9 and opt.momentum_form == "lr_in_velocity"


def test_the_rcp_64_config_is_the_config_of_lbnls_reference_runs() -> None:
    """No log of the batch-64 RCP runs is published; their config and the TF code it ran are."""
    source = yaml.safe_load((SOURCES / "lbnl_cosmo_rcp_64.yaml").read_text(encoding="utf-8"))
    schedule, cfg = source["lr_schedule"], rcp_config(64)
    opt = cfg.optimizer
    assert schedule["scaling"] == "linear" and opt.base_learning_rate == schedule["base_lr"]
    assert opt.base_batch_size == schedule["base_batch_size"] == 64 == cfg.loop.global_batch_size
    assert opt.warmup_epochs == schedule["n_warmup_epochs"]
    assert dict(zip(opt.decay_boundary_epochs, opt.decay_factors, strict=True)) == schedule["decay_schedule"]
    assert opt.decay_first_epoch_num == "b+2"  # `e < epoch` in `_lr_schedule`, epoch counted from 0
    assert cfg.model.dropout == source["model"]["dropout"]
    assert opt.gradient_weight_decay() == 2 * source["model"]["l2"]  # Keras l2(λ) puts λ Σ w² on the loss
    assert source["optimizer"] == {"name": "SGD", "momentum": 0.9}  # Keras SGD: the LR in the velocity
    assert opt.momentum_form == "lr_in_velocity"


def test_json_differs_says_what_the_runs_logged() -> None:
    for (_, key), (run_logged, _, excerpt) in JSON_DIFFERS.items():
        assert logged_keys(SOURCES / excerpt)[key] == run_logged


def test_where_the_json_holds_one_decay_factor_the_configs_train_the_runs_factors() -> None:
    records = {name: record for bench, name, record in references() if bench == "cosmoflow"}
    scalar = {
        n
        for n, r in records.items()
        if not isinstance(r["Hyperparams"]["opt_learning_rate_decay_factor"], list)
    }
    assert scalar == set(JSON_ONE_FACTOR)
    for name, factors in JSON_ONE_FACTOR.items():
        assert records[name]["Hyperparams"]["opt_learning_rate_decay_factor"] == max(factors)
        cfg = rcp_config(records[name]["BS"])
        assert cfg.optimizer.decay_factors == factors and cfg.optimizer.decay_factor_logged == "max"


def test_the_lr_nvidia_logged_at_batch_32_is_the_rcp_32_schedule() -> None:
    """The run behind cosmoflow_ref_32 logged its LR at every epoch's start, to its stop at epoch 11."""

    logged = logged_lr(SOURCES / "nvidia_v2.0_pytorch_bs32_result_002.txt")
    assert sorted(logged) == list(range(1, 12))
    ours = learning_rate_per_epoch(rcp_config(32))
    for epoch_num, lr in logged.items():
        assert ours[epoch_num - 1] == pytest.approx(lr, rel=1e-12) == REFERENCE_LR[32][epoch_num - 1]


def test_nvidias_pytorch_code_decays_one_epoch_before_fujitsus_at_batch_512() -> None:
    """HelmholtzAI's ten v2.0 batch-512 runs trained Fujitsu's hyperparameters with NVIDIA's PyTorch
    code and logged every epoch's LR: each decay from epoch_num b+1 (20, 22 for boundaries 19, 21).
    rcp_512 with decay_first_epoch_num=b+1 reproduces every logged LR; as configured (b+2, Fujitsu's
    code, the source of the RCP) it differs at exactly those epochs."""

    logs = sorted(HELMHOLTZ_512.glob("result_*.txt"))
    assert len(logs) == 10
    b1 = learning_rate_per_epoch(rcp_config(512, ["optimizer.decay_first_epoch_num=b+1"]))
    b2 = learning_rate_per_epoch(rcp_config(512))
    for path in logs:
        logged = logged_lr(path)
        assert min(logged) == 1 and max(logged) >= 21, path
        assert all(b1[n - 1] == pytest.approx(lr, rel=1e-12) for n, lr in logged.items()), path
        differ = {n for n, lr in logged.items() if b2[n - 1] != pytest.approx(lr, rel=1e-12)}
        assert differ == {20, 22} & set(logged), path
