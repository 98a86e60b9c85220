"""The shared loop on the toy benchmark: MLLOG order, the aborts, the numerics, and what a training
step costs in host syncs and collectives (none beyond DDP's gradient all-reduce)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from mlhpc.benchmarks.cosmoflow import train as cosmo_train
from mlhpc.common.cluster.distributed import DistContext, init_distributed
from mlhpc.common.contract import registry
from mlhpc.common.training.batches import to_device
from mlhpc.common.training.loop import resolve_memory_format
from tests.helpers.launchers import torchrun
from tests.helpers.mllog_files import mllog_events
from tests.helpers.toy_benchmark import TOY, collectives_script, make_config, run_toy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ctx() -> DistContext:
    return init_distributed("gloo", "cpu")


def keys_in_order(events: list[dict]) -> list[str]:
    return [e["key"] for e in events]


def assert_intervals_closed(events: list[dict]) -> None:
    """Every *_start has its *_stop after it, with the same epoch_num, and none is left open."""
    open_intervals: list[tuple[str, Any]] = []
    for event in events:
        epoch = (event.get("metadata") or {}).get("epoch_num")
        if event["event_type"] == "INTERVAL_START":
            open_intervals.append((event["key"].removesuffix("_start"), epoch))
        elif event["event_type"] == "INTERVAL_END":
            name = event["key"].removesuffix("_stop")
            assert open_intervals, f"{event['key']} without a start"
            started, started_epoch = open_intervals.pop()
            assert started == name, f"{event['key']} closes {started}_start"
            if name in ("epoch", "eval"):
                assert epoch == started_epoch
    assert not open_intervals, f"left open: {open_intervals}"


def test_a_run_to_target_logs_events_in_order(ctx: DistContext, tmp_path: Path) -> None:
    result = run_toy(make_config(target=0.05, max_epochs=20), ctx, tmp_path / "log.txt")
    events = mllog_events(tmp_path / "log.txt")
    keys = keys_in_order(events)
    assert result.status == "success" and 2 <= result.epochs < 20
    assert result.metrics == sorted(result.metrics, reverse=True)  # it learns
    order = ["init_start", "init_stop", "run_start", "staging_start", "staging_stop", "epoch_start"]
    assert [keys.index(k) for k in order] == sorted(keys.index(k) for k in order)
    assert keys.count("epoch_start") == keys.count("eval_error") == result.epochs
    assert keys[-1] == "run_stop"
    assert events[-1]["metadata"]["status"] == "success"
    assert events[-1]["metadata"]["epoch_num"] == result.epochs
    assert_intervals_closed(events)
    staging_stop = events[keys.index("staging_stop")]
    assert staging_stop["metadata"]["staged_files"] == 0  # the stage callback's report
    assert result.breakdown is not None and result.breakdown.settings["precision"] == "fp32"


@pytest.mark.parametrize("inside", [True, False])
def test_staging_inside_or_before_run_start(ctx: DistContext, tmp_path: Path, inside: bool) -> None:
    run_toy(make_config(max_epochs=1), ctx, tmp_path / "log.txt", staging="inside" if inside else "before")
    keys = keys_in_order(mllog_events(tmp_path / "log.txt"))
    assert (keys.index("staging_start") > keys.index("run_start")) is inside
    assert keys.index("staging_start") > keys.index("init_stop")


def test_max_epochs_aborts_with_a_well_formed_log(ctx: DistContext, tmp_path: Path) -> None:
    result = run_toy(make_config(target=0.0, max_epochs=2), ctx, tmp_path / "log.txt")
    events = mllog_events(tmp_path / "log.txt")
    assert result.status == "aborted" and result.epochs == 2
    assert "loop.max_epochs=2" in (result.error or "")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert_intervals_closed(events)


def test_fixed_epochs_mode_trains_every_epoch_past_the_target(ctx: DistContext, tmp_path: Path) -> None:
    """HPC AI500's way: a fixed number of epochs, the quality reached is the result."""
    result = run_toy(make_config(target=10.0, max_epochs=3, mode="fixed_epochs"), ctx, tmp_path / "log.txt")
    events = mllog_events(tmp_path / "log.txt")
    assert result.status == "success" and result.epochs == 3  # the target was met at epoch 1
    assert [e["key"] for e in events].count("eval_error") == 3
    assert events[-1]["metadata"] == {**events[-1]["metadata"], "status": "success", "epoch_num": 3}


def test_non_finite_loss_aborts_naming_epoch_and_step(ctx: DistContext, tmp_path: Path) -> None:
    cfg = make_config(max_epochs=5, data__nan_samples=64)  # every sample: step 0 is the first bad one
    result = run_toy(cfg, ctx, tmp_path / "log.txt")
    events = mllog_events(tmp_path / "log.txt")
    keys = keys_in_order(events)
    assert result.status == "aborted"
    assert result.error is not None and "non-finite loss at epoch 1 step 0" in result.error
    assert "eval_start" not in keys  # stopped at the end of the epoch, before evaluating it
    assert keys.count("epoch_stop") == 1  # the open epoch was closed
    assert_intervals_closed(events)


class _HostSyncs:
    """Counts the tensor methods that read a value back to the host (a sync on a GPU)."""

    NAMES = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(tensor: torch.Tensor, *args: Any, _original: Any = original) -> Any:
                self.count += 1
                return _original(tensor, *args)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize(("interval", "per_step"), [(0, 0.0), (4, 0.25)])
def test_host_syncs_per_step(
    ctx: DistContext, monkeypatch: pytest.MonkeyPatch, interval: int, per_step: float
) -> None:
    """Two runs that differ only in steps per epoch: their difference is what a step costs."""
    syncs = _HostSyncs(monkeypatch)
    counts = []
    for samples in (32, 64):  # 4 and 8 steps per epoch, 2 epochs
        syncs.count = 0
        run_toy(
            make_config(max_epochs=2, finite_check_interval=interval, data__train_samples=samples), ctx, None
        )
        counts.append(syncs.count)
    assert (counts[1] - counts[0]) / (2 * 4) == per_step, counts


@pytest.mark.distributed
def test_collectives_per_step_on_two_gloo_ranks(tmp_path: Path) -> None:
    """At most DDP's gradient all-reduce per step (one bucket for the toy), none on the micro-steps
    before the last of an accumulation group; counted by torch's profiler on a real group."""
    settings = [
        {"max_epochs": 1, "data__train_samples": samples, "gradient_accumulation_steps": accumulate}
        for accumulate in (1, 2)
        for samples in (32, 64)
    ]
    script = tmp_path / "count.py"
    script.write_text(collectives_script())
    proc = torchrun(
        [str(script), str(tmp_path), json.dumps(settings)], REPO, timeout=300, PYTHONPATH=str(REPO)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        counts = list(json.loads((tmp_path / f"rank{rank}.json").read_text()).values())
        # 32 -> 64 samples over 2 ranks with a global batch of 8 adds 4 optimizer steps: 4 DDP
        # all-reduces, whether those steps are 4 micro-steps or 8 (accumulation 2).
        assert counts[1] - counts[0] == 4, counts
        assert counts[3] - counts[2] == 4, counts


def test_lr_schedule_counts_optimizer_steps_under_accumulation(
    ctx: DistContext, tmp_path: Path, cosmo_cfg: Any
) -> None:
    """CosmoFlow's epoch-based decay lands on its epoch however many micro-batches make a step."""
    cosmo = cosmo_cfg(
        "optimizer.warmup_epochs=0", "optimizer.decay_boundary_epochs=[2]", "optimizer.decay_factors=[0.1]"
    )
    made = []

    def build_optimizer(cfg: Any, model: torch.nn.Module, ctx: DistContext, steps: int) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=cosmo_train.scaled_learning_rate(cosmo))
        made.append((optimizer, cosmo_train.lr_scheduler(cosmo, optimizer, steps)))
        return made[-1]

    bench = dataclasses.replace(TOY, build_optimizer=build_optimizer)
    lrs = {}
    for accumulate in (1, 2):
        run_toy(make_config(max_epochs=2, gradient_accumulation_steps=accumulate), ctx, None, bench=bench)
        optimizer, scheduler = made[-1]
        lrs[accumulate] = optimizer.param_groups[0]["lr"]
        assert scheduler.last_epoch == 2 * 8  # 64 samples / global batch 8, twice, whatever the micro-batches
    expected = cosmo_train.scaled_learning_rate(cosmo) * 0.1  # after epoch 2: decayed once
    assert lrs[1] == pytest.approx(expected) and lrs[2] == pytest.approx(expected)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_reaches_the_target(ctx: DistContext, precision: str) -> None:
    result = run_toy(make_config(target=0.05, max_epochs=20, precision=precision), ctx, None)
    assert result.status == "success", result.error
    assert result.breakdown is not None and result.breakdown.settings["precision"] == precision


def test_one_grad_scaler_for_the_whole_run(ctx: DistContext, monkeypatch: pytest.MonkeyPatch) -> None:
    made = Counter()
    original = torch.amp.GradScaler.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        made["scalers"] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "__init__", counting_init)
    run_toy(make_config(max_epochs=3, precision="fp16"), ctx, None)
    assert made["scalers"] == 1


@pytest.mark.slow
def test_compiled_model_trains_and_counts_flops(ctx: DistContext) -> None:
    result = run_toy(make_config(target=0.05, max_epochs=20, compile=True), ctx, None)
    assert result.status == "success", result.error
    assert result.flops_per_sample > 0
    assert result.breakdown is not None and result.breakdown.settings["compile"] is True


def test_memory_format_follows_the_benchmark_and_the_device() -> None:
    loop = make_config().loop
    cosmoflow, deepcam = registry.get("cosmoflow"), registry.get("deepcam")
    assert resolve_memory_format(loop, cosmoflow, torch.device("cpu")) == "channels_last_3d"
    assert resolve_memory_format(loop, cosmoflow, torch.device("cuda")) == "channels_last_3d"
    assert resolve_memory_format(loop, deepcam, torch.device("cpu")) == "contiguous"
    assert resolve_memory_format(loop, deepcam, torch.device("cuda")) == "channels_last"
    assert resolve_memory_format(loop, cosmoflow, torch.device("meta")) == "contiguous"
    forced = dataclasses.replace(loop, memory_format="contiguous")
    assert resolve_memory_format(forced, cosmoflow, torch.device("cuda")) == "contiguous"
    assert resolve_memory_format(forced, cosmoflow, torch.device("cpu")) == "contiguous"
    cube, target = to_device(
        (torch.zeros(2, 4, 3, 3, 3), torch.zeros(2, 4)), torch.device("cpu"), "channels_last_3d"
    )
    assert cube.is_contiguous(memory_format=torch.channels_last_3d) and not cube.is_contiguous()
    assert target.is_contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_toy_reaches_target_on_a_gpu(precision: str) -> None:
    gpu = init_distributed("nccl", "cuda")
    result = run_toy(make_config(target=0.05, max_epochs=20, precision=precision), gpu, None)
    assert result.status == "success", result.error
