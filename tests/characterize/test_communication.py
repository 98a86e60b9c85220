"""The distributed level on real 2-rank gloo groups: the all-reduce bytes DDP's hook counts are the
trainable parameters' bytes, exactly; a failed or hung rank ends in one line, no rank left behind."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mlhpc.characterize.communication import CommLevel, measure_communication
from mlhpc.characterize.workload import Workload, parameter_bytes, trainable_bytes
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError, MlhpcError

pytestmark = pytest.mark.distributed

STEPS = 3


# ---------------------------------------------------------------- the factories the ranks call
def _mse(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, target = batch
    return F.mse_loss(model(inputs), target)


def _workload(model: torch.nn.Module, inputs: torch.Tensor, target: torch.Tensor, rank: int) -> Workload:
    """Every rank the same model (seeded before), its own random batch, repeated forever."""
    generator = torch.Generator().manual_seed(rank)
    batch = (torch.rand(inputs.shape, generator=generator), torch.rand(target.shape, generator=generator))
    return Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        compute_loss=_mse,
        batches=itertools.repeat(batch),
        device=torch.device("cpu"),
        batch_size=inputs.shape[0],
    )


def conv_model() -> torch.nn.Module:
    """A small conv net whose first layer is frozen: its bytes are parameters DDP never reduces."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 4),
    )
    model[0].requires_grad_(False)
    return model


def conv_workload(rank: int) -> Workload:
    return _workload(conv_model(), torch.empty(4, 3, 16, 16), torch.empty(4, 4), rank)


def cosmoflow_config() -> object:
    bench = registry.get("cosmoflow")
    return load_config(bench.config_class, bench.config_path("mini"), [])


def cosmoflow_workload(rank: int) -> Workload:
    """The CosmoFlow mini model on random cubes of the mini size, MSE loss (the benchmark's)."""
    cfg = cosmoflow_config()
    torch.manual_seed(0)
    model = registry.get("cosmoflow").build_model(cfg)
    size, channels = cfg.data.sample_size, cfg.data.num_channels  # type: ignore[attr-defined]
    local_batch = cfg.loop.global_batch_size // 2  # type: ignore[attr-defined]
    cubes = torch.empty(local_batch, channels, size, size, size)
    return _workload(model, cubes, torch.empty(local_batch, 4), rank)


def failing_on(bad_rank: int, rank: int) -> Workload:
    if rank == bad_rank:
        raise ValueError(f"no workload on rank {rank}")
    return conv_workload(rank)


def hung_on(bad_rank: int, rank: int) -> Workload:
    if rank == bad_rank:
        time.sleep(3600)
    return conv_workload(rank)


def gpu_conv_workload(rank: int) -> Workload:
    device = torch.device("cuda", torch.cuda.current_device())
    work = conv_workload(rank)
    work.model.to(device)
    batch = next(work.batches)
    work.batches = itertools.repeat(tuple(t.to(device) for t in batch))
    work.device = device
    return work


# ---------------------------------------------------------------- the tests
def _ranks_left() -> list[int]:
    """This process's children still running a rank (a finished one has been waited for)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"mlhpc.characterize.communication" in cmdline:
            left.append(int(stat.parent.name))
    return left


def _check_level(level: CommLevel, backend: str = "gloo", world_size: int = 2) -> None:
    json.dumps(dataclasses.asdict(level))  # the page's JSON takes it as it is
    assert (level.backend, level.world_size, level.steps) == (backend, world_size, STEPS)
    assert level.allreduce_bytes_per_step == level.analytic_allreduce_bytes  # exactly
    assert sum(level.bucket_bytes) == level.allreduce_bytes_per_step
    assert level.collectives_per_step == len(level.bucket_bytes) >= 1
    ring = 2 * (world_size - 1) / world_size * level.allreduce_bytes_per_step
    assert level.ring_bytes_sent_per_rank == ring  # 2(n-1)/n: the volume itself at n = 2
    assert 0 < level.comm_share < 1
    assert 0 < level.comm_s < level.step_serial_s
    assert level.step_no_comm_s > 0 and level.step_s > 0 and level.exposed_comm_s >= 0
    assert len(level.rank_step_s) == world_size and all(s > 0 for s in level.rank_step_s)
    assert not _ranks_left()


def test_conv_model_reduces_its_trainable_bytes_exactly() -> None:
    level = measure_communication(conv_workload, steps=STEPS, timeout_s=120)
    _check_level(level)
    model = conv_model()
    assert level.analytic_allreduce_bytes == trainable_bytes(model)
    # The control: the frozen layer is in the model's bytes but never reduced.
    assert level.allreduce_bytes_per_step < parameter_bytes(model)


def test_cosmoflow_mini_model_reduces_its_trainable_bytes_exactly() -> None:
    level = measure_communication(cosmoflow_workload, steps=STEPS, timeout_s=120)
    _check_level(level)
    model = registry.get("cosmoflow").build_model(cosmoflow_config())
    assert level.analytic_allreduce_bytes == trainable_bytes(model)


def test_one_rank_still_counts_the_buckets_and_sends_nothing() -> None:
    level = measure_communication(conv_workload, steps=STEPS, world_size=1, timeout_s=120)
    assert level.allreduce_bytes_per_step == level.analytic_allreduce_bytes == trainable_bytes(conv_model())
    assert level.ring_bytes_sent_per_rank == 0 and level.bus_bandwidth_bytes_per_s == 0
    assert 0 <= level.comm_share < 1 and len(level.rank_step_s) == 1
    assert not _ranks_left()


def test_a_failing_rank_is_one_line_naming_it() -> None:
    with pytest.raises(MlhpcError, match=r"rank 1 failed: ValueError: no workload on rank 1$"):
        measure_communication(functools.partial(failing_on, 1), steps=1, timeout_s=120)
    assert not _ranks_left()


def test_a_hung_rank_does_not_hang_the_caller() -> None:
    start = time.monotonic()
    with pytest.raises(MlhpcError, match=r"rank\(s\) 0, 1 did not finish within 8 s"):
        measure_communication(functools.partial(hung_on, 1), steps=1, timeout_s=8)
    assert time.monotonic() - start < 20
    assert not _ranks_left()


def test_refuses_what_cannot_reach_the_ranks() -> None:
    with pytest.raises(ConfigError, match="module-level function"):
        measure_communication(lambda rank: conv_workload(rank), steps=1)
    with pytest.raises(ConfigError, match="steps=0"):
        measure_communication(conv_workload, steps=0)
    with pytest.raises(ConfigError, match="use gloo or nccl"):
        measure_communication(conv_workload, steps=1, backend="mpi")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL needs a CUDA device")
def test_nccl_rank_reduces_the_trainable_bytes() -> None:
    """The NCCL path on as many ranks as there are devices (a rank a device), at most 2."""
    ranks = min(2, torch.cuda.device_count())
    level = measure_communication(
        gpu_conv_workload, steps=STEPS, world_size=ranks, backend="nccl", timeout_s=180
    )
    _check_level(level, "nccl", ranks)


def test_nccl_needs_a_device_per_rank() -> None:
    ranks = torch.cuda.device_count() + 1
    with pytest.raises(ConfigError, match=f"a CUDA device per rank: {ranks - 1} for world_size={ranks}"):
        measure_communication(gpu_conv_workload, steps=1, world_size=ranks, backend="nccl")
