"""`mlhpc run ... --dry-run`: the config (and the data) checked, the init events printed, nothing
built or written."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.cli import mlhpc_cli


def events(stdout: str) -> dict[str, object]:
    lines = [json.loads(line.split(":::MLLOG", 1)[1]) for line in stdout.splitlines() if ":::MLLOG" in line]
    return {e["key"]: e["value"] for e in lines}


def one_sample_dataset(root: Path, sample_size: int) -> Path:
    """A CosmoFlow dataset of one sparse sample per split: what validation reads, in no time."""
    for split in ("train", "validation"):
        folder = root / split
        folder.mkdir(parents=True)
        np.lib.format.open_memmap(folder / "x.npy", "w+", np.dtype("<i2"), (sample_size,) * 3 + (4,)).flush()
        np.save(folder / "y.npy", np.zeros(4, np.float32))
        (folder / "files_data.lst").write_text("x.npy\n")
        (folder / "files_label.lst").write_text("y.npy\n")
    return root


def test_dry_run_prints_the_rcp_hyperparameters_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    data = one_sample_dataset(tmp_path / "data", 128)  # rcp_512 without --data would generate TBs
    args = ["run", "cosmoflow", "--config", "rcp_512", "--out", str(out), "--data", str(data), "--dry-run"]
    proc = mlhpc_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    logged = events(proc.stdout)
    assert logged["global_batch_size"] == 512
    assert logged["opt_base_learning_rate"] == 0.024 and logged["opt_learning_rate_warmup_factor"] == 4.0
    assert logged["opt_learning_rate_decay_factor"] == [0.5, 0.25, 0.125, 0.0625]
    keys = list(logged)
    assert keys.index("init_start") < keys.index("seed") < keys.index("init_stop")
    assert "run_start" not in logged
    assert "Nothing was trained, staged or written" in proc.stdout
    assert not out.exists() and not (tmp_path / "local").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["loop.max_epoch=3"], "loop.max_epoch"),  # a typo in an override
        (["--config", "rcp_77"], "rcp_77"),
        (["--staging", "before", "--ruleset", "2.0.0"], "--staging before is not allowed"),
        (["loop.global_batch_size=3", "loop.gradient_accumulation_steps=2"], "not divisible"),
    ],
)
def test_dry_run_refuses_a_run_that_would_fail(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--dry-run", *extra], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dry_run_checks_the_data_it_is_given(tmp_path: Path) -> None:
    data = tmp_path / "not_a_dataset"
    data.mkdir()
    (data / "train").mkdir()
    proc = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--data", str(data), "--dry-run"], tmp_path
    )
    assert proc.returncode != 0
    assert str(data) in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_shows_the_weak_scaling_plan_of_instances(tmp_path: Path) -> None:
    """One process with --instances N launches N ranks itself; its dry run plans for them."""
    out = tmp_path / "runs"
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(out), "--instances", "2", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "weak scaling" in proc.stdout and "2 instances at once on 1 rank(s) each" in proc.stdout
    assert not out.exists()
    # Under a launcher, the ranks it started must split into the instances.
    launched = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}
    refused = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(out), "--instances", "2", "--dry-run"], tmp_path, **launched
    )
    assert refused.returncode == 2 and "--instances 2 does not divide the 3 rank(s)" in refused.stderr


def config_id(*overrides: str) -> str:
    from mlhpc.campaign.io import resolve_config

    return resolve_config("cosmoflow", "mini", overrides).config_id


def record(out: Path, first_seed: int, config: str) -> None:
    entry = {"config": "mini", "config_id": config, "seeds": 3, "first_seed": first_seed}
    settings = {
        "submitter": "mlhpc",
        "system": "ci",
        "division": "closed",
        "status": "onprem",
        "ruleset": "3.0.0",
    }
    campaign = {
        "mlhpc_campaign": 1,
        "hardware": None,
        "settings": settings,
        "entries": {"cosmoflow/strong": entry},
    }
    out.mkdir(parents=True)
    (out / "campaign.json").write_text(json.dumps(campaign))


def test_dry_run_goes_through_the_planner(tmp_path: Path) -> None:
    """A dry run refuses what the run would: a changed config, another first seed, a taken index;
    and it follows the recorded first seed."""
    out = tmp_path / "runs"
    record(out, 700, config_id())
    before = (out / "campaign.json").read_bytes()
    base = ["run", "cosmoflow", "--out", str(out), "--dry-run"]

    follows = mlhpc_cli([*base, "--index", "2"], tmp_path)
    assert follows.returncode == 0, follows.stderr
    assert events(follows.stdout)["seed"] == 702 and "seeds [702]" in follows.stdout

    other_seed = mlhpc_cli([*base, "--index", "1", "--first-seed", "9"], tmp_path)
    assert other_seed.returncode == 2 and "first seed 700" in other_seed.stderr
    assert "drop --first-seed" in other_seed.stderr and other_seed.stderr.count("\n") == 1

    changed = mlhpc_cli([*base, "--index", "1", "loop.max_epochs=3"], tmp_path)
    assert changed.returncode == 2 and "pass the same --config and overrides" in changed.stderr

    folder = out / "mlhpc/results/ci/strong/cosmoflow"
    write_finished_log(folder / "result_1.txt", seed=701)
    taken = mlhpc_cli([*base, "--index", "1"], tmp_path)
    assert taken.returncode == 2 and "result_1.txt" in taken.stderr and "pick another --index" in taken.stderr
    assert (out / "campaign.json").read_bytes() == before  # a dry run writes nothing


def write_finished_log(path: Path, seed: int) -> None:
    """The lines of a result log that a resume reads as finished with `seed`."""
    events = [("POINT_IN_TIME", "seed", seed, {}), ("INTERVAL_START", "run_start", None, {})]
    events.append(("INTERVAL_END", "run_stop", None, {"status": "success"}))
    lines = [
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 1_700_000_000_000 + i,
                "event_type": kind,
                "key": key,
                "value": value,
                "metadata": metadata,
            }
        )
        for i, (kind, key, value, metadata) in enumerate(events)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- what will train


def cpu_context(world_size: int = 1) -> Any:
    import torch

    from mlhpc.common.cluster.distributed import DistContext

    return DistContext(
        rank=0,
        local_rank=0,
        world_size=world_size,
        local_world_size=world_size,
        num_nodes=1,
        device=torch.device("cpu"),
        backend="none",
        launcher="none",
    )


def trainable_names(benchmark: str, config: str) -> list[str]:
    """The trainable parameters of the benchmark's real model (on the meta device)."""
    import torch

    from mlhpc.campaign.io import resolve_config

    resolved = resolve_config(benchmark, config, [])
    with torch.device("meta"):
        model = resolved.benchmark.build_model(resolved.cfg)
    return [name for name, p in model.named_parameters() if p.requires_grad]


def assert_names_each_trainable_once(view: dict[str, Any], benchmark: str, config: str) -> None:
    named = [name for group in view["param_groups"] for name in group["names"]]
    assert sorted(named) == sorted(trainable_names(benchmark, config))  # each once, none left out
    assert all(group["count"] == len(group["names"]) for group in view["param_groups"])


def assert_decay_on_dense_kernels_only(view: dict[str, Any], decay: float) -> None:
    """CosmoFlow's weight decay acts on the hidden dense kernels' gradient and nowhere else."""
    on = {name: g["weight_decay_on_gradient"] for g in view["param_groups"] for name in g["names"]}
    kernels = {"dense.0.weight", "dense.1.weight"}
    assert {name: on[name] for name in kernels} == dict.fromkeys(kernels, decay)
    assert not any(wd for name, wd in on.items() if name not in kernels)


def test_dry_run_json_of_cosmoflow_rcp_128_is_the_reference_schedule(tmp_path: Path) -> None:
    """NVIDIA's batch-128 run: 0.001 at epoch_num 1, the peak 0.004 at epoch_num 5, every epoch as
    test_rcp_configs works it out from the source; no weight decay (the MXNet run had none), on the
    dense kernels or elsewhere."""
    from tests.helpers.rcp_references import REFERENCE_GRADIENT_WEIGHT_DECAY, REFERENCE_LR

    out, written = tmp_path / "runs", tmp_path / "what.json"
    data = one_sample_dataset(tmp_path / "data", 128)
    args = ["run", "cosmoflow", "--config", "rcp_128", "--out", str(out), "--data", str(data)]
    proc = mlhpc_cli([*args, "--dry-run", "--json", str(written)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    view = json.loads(written.read_text())
    lrs = view["lr_per_epoch"]
    assert lrs[0] == 0.001 and lrs[4] == 0.004 and max(lrs) == 0.004
    assert lrs == pytest.approx(REFERENCE_LR[128], rel=1e-12)
    assert len(lrs) == view["config"]["loop"]["max_epochs"]
    assert view["config"]["loop"]["global_batch_size"] == 128 and view["config_name"] == "rcp_128"
    assert_decay_on_dense_kernels_only(view, REFERENCE_GRADIENT_WEIGHT_DECAY[128])
    assert_names_each_trainable_once(view, "cosmoflow", "rcp_128")
    # The printed table says the same, runs of equal LRs collapsed into one line.
    assert "epoch         1  0.001\n" in proc.stdout and "epoch      5-17  0.004\n" in proc.stdout
    assert "2 parameters, WD on gradient 0: dense.0.weight, dense.1.weight" in proc.stdout
    assert "  loop: global_batch_size=128, " in proc.stdout and "momentum_form=lr_in_velocity" in proc.stdout
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["data", "what.json"]


@pytest.mark.parametrize("benchmark", ["deepcam", "extreme_weather"])
def test_dry_run_json_of_a_mini_has_an_lr_for_every_epoch(tmp_path: Path, benchmark: str) -> None:
    """The real optimizer and scheduler built over the real model, stepped through the epochs."""
    written = tmp_path / "sub" / "what.json"  # a folder made on the way
    proc = mlhpc_cli(
        ["run", benchmark, "--out", str(tmp_path / "runs"), "--dry-run", "--json", str(written)], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    view = json.loads(written.read_text())
    lrs = view["lr_per_epoch"]
    assert len(lrs) == view["config"]["loop"]["max_epochs"]
    # DeepCAM warms up from 0 at its first step, as the reference's MultiStepLRWarmup does.
    assert all(math.isfinite(lr) and lr >= 0 for lr in lrs) and all(lr > 0 for lr in lrs[1:])
    assert_names_each_trainable_once(view, benchmark, "mini")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("batch", [32, 64, 128, 512, 1024])
def test_what_trains_matches_the_cosmoflow_schedule_of_every_rcp(batch: int) -> None:
    from mlhpc.campaign.dry_run import what_trains
    from mlhpc.campaign.io import resolve_config
    from tests.helpers.cosmoflow_lr import learning_rate_per_epoch
    from tests.helpers.rcp_references import REFERENCE_GRADIENT_WEIGHT_DECAY, REFERENCE_LR

    resolved = resolve_config("cosmoflow", f"rcp_{batch}", [])
    view = what_trains(resolved.benchmark, resolved.cfg, cpu_context())
    assert_decay_on_dense_kernels_only(view, REFERENCE_GRADIENT_WEIGHT_DECAY[batch])
    assert view["lr_per_epoch"] == pytest.approx(learning_rate_per_epoch(resolved.cfg), rel=1e-12)
    assert view["lr_per_epoch"] == pytest.approx(REFERENCE_LR[batch], rel=1e-12)


@pytest.mark.parametrize(("benchmark", "ranks"), [("deepcam", 1), ("deepcam", 4), ("extreme_weather", 2)])
def test_the_lr_read_from_the_lambda_is_the_lr_of_the_stepped_scheduler(benchmark: str, ranks: int) -> None:
    """The shortcut for LambdaLR equals stepping the real scheduler after real optimizer steps."""
    import torch

    from mlhpc.campaign.dry_run import lr_at_steps, train_steps_per_epoch
    from mlhpc.campaign.io import resolve_config

    resolved = resolve_config(benchmark, "mini", [])
    bench, cfg = resolved.benchmark, resolved.cfg
    steps = train_steps_per_epoch(cfg, ranks)
    assert steps == cfg.data.num_train_samples // cfg.loop.global_batch_size
    model = torch.nn.Linear(2, 1)  # the optimizer's arithmetic does not matter, its LR does
    optimizer, scheduler = bench.build_optimizer(cfg, model, cpu_context(ranks), steps)
    stepped = []
    for _ in range(cfg.loop.max_epochs):
        stepped.append(optimizer.param_groups[0]["lr"])
        for _ in range(steps):
            model(torch.ones(2)).sum().backward()
            optimizer.step()
            scheduler.step()
    fresh, fresh_scheduler = bench.build_optimizer(cfg, torch.nn.Linear(2, 1), cpu_context(ranks), steps)
    epochs = [e * steps for e in range(cfg.loop.max_epochs)]
    assert lr_at_steps(fresh, fresh_scheduler, epochs) == pytest.approx(stepped, rel=1e-12)
    # and a scheduler of another kind is stepped through
    other = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    decay = torch.optim.lr_scheduler.StepLR(other, step_size=steps, gamma=0.5)
    assert lr_at_steps(other, decay, epochs[:4]) == [1.0, 0.5, 0.25, 0.125]


def test_full_configs_are_described_on_the_meta_device_in_seconds() -> None:
    import time

    from mlhpc.campaign.dry_run import training_text, what_trains
    from mlhpc.campaign.io import resolve_config

    for benchmark in ("cosmoflow", "deepcam", "extreme_weather"):
        started = time.perf_counter()
        resolved = resolve_config(benchmark, "full", [])
        view = what_trains(resolved.benchmark, resolved.cfg, cpu_context())
        assert time.perf_counter() - started < 60
        assert len(view["lr_per_epoch"]) == resolved.cfg.loop.max_epochs
        assert_names_each_trainable_once(view, benchmark, "full")
        json.dumps(view, allow_nan=False)  # plain, finite JSON
        assert "learning rate at the first step" in training_text(view)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.001, 0.004, 1e-300, 2.5]), max_size=40))
def test_collapsed_runs_give_back_the_list(values: list[float]) -> None:
    from mlhpc.campaign.dry_run import collapse_runs

    runs = collapse_runs(values)
    assert [v for first, last, v in runs for _ in range(first, last + 1)] == values
    assert all(a[2] != b[2] and a[1] + 1 == b[0] for a, b in itertools.pairwise(runs))
    assert not runs or (runs[0][0] == 1 and runs[-1][1] == len(values))


@pytest.mark.parametrize(
    ("where", "extra", "message"),
    [
        (lambda t: t / "data" / "what.json", ["--dry-run"], "is inside the input"),
        (lambda t: t / "data", ["--dry-run"], "is the input"),
        (lambda t: t / "runs" / "campaign.json", ["--dry-run"], "is the input"),
        (lambda t: t / "runs" / "mlhpc" / "x.json", ["--dry-run"], "is inside the input"),
        (lambda t: t / "notes.txt", ["--dry-run"], "does not end in .json"),
        (lambda t: t / "what.json", [], "add --dry-run"),
        (lambda t: t / "what.json", ["--dry-run", "--slurm"], "add --dry-run (without --slurm)"),
    ],
)
def test_dry_run_json_refuses_to_write_over_an_input(
    tmp_path: Path,
    where: Callable[[Path], Path],
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In this process (refused before any MLLOG line): one line naming --json, nothing changed."""
    from mlhpc.cli import main

    data = one_sample_dataset(tmp_path / "data", 128)
    record(tmp_path / "runs", 700, config_id())
    (tmp_path / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = ["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--data", str(data), "--index", "0"]
    code = main([*args, "--json", str(where(tmp_path)), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("mlhpc: error: --json "), err
    assert message in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_benchmark_without_a_sample_count_still_shows_its_groups() -> None:
    """A third-party config without data.num_train_samples: the groups, and the LR left unknown
    (said so) rather than guessed from a made-up epoch."""
    from mlhpc.campaign.dry_run import training_text, what_trains
    from tests.helpers.toy_benchmark import TOY, make_config

    view = what_trains(TOY, make_config(hidden=4), cpu_context())
    assert view["steps_per_epoch"] is None and view["lr_per_epoch"] is None
    names = [name for group in view["param_groups"] for name in group["names"]]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert "learning rate per epoch: unknown" in training_text(view)


def test_a_schedule_that_goes_non_finite_is_refused_naming_the_epoch() -> None:
    """A dry run says a run would fail: an LR of nan at epoch_num 3 is one ConfigError naming it."""
    import dataclasses

    import torch

    from mlhpc.campaign.dry_run import what_trains
    from mlhpc.campaign.io import resolve_config
    from mlhpc.common.errors import ConfigError

    def build_optimizer(cfg: Any, model: Any, ctx: Any, steps: int) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: math.nan if step >= 2 * steps else 1.0)
        return optimizer, lr

    resolved = resolve_config("cosmoflow", "mini", [])
    bench = dataclasses.replace(resolved.benchmark, build_optimizer=build_optimizer)
    with pytest.raises(ConfigError, match=r"^the learning rate at epoch_num 3 would be nan"):
        what_trains(bench, resolved.cfg, cpu_context())
