"""The DALI DeepCAM loader against the torch one: the same batches in the same order (CPU
pipelines fed by parallel h5py workers; one GPU test)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="nvidia-dali is not installed (pip install 'mlhpc[gpu]')")

from mlhpc.benchmarks.deepcam import data, functions
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.common.cluster.distributed import DistContext, init_distributed
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config

pytestmark = pytest.mark.dali

SMALL = [
    "data.height=32",
    "data.width=48",
    "data.num_train_samples=10",
    "data.num_eval_samples=5",
    "loop.global_batch_size=4",
]


def make_cfg(*overrides: str) -> DeepCamConfig:
    return load_config(DeepCamConfig, registry.get("deepcam").config_path("mini"), [*SMALL, *overrides])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.generate(make_cfg(), tmp_path_factory.mktemp("deepcam_dali") / "data", seed=2)


@pytest.fixture(scope="module")
def ctx() -> DistContext:
    return init_distributed("auto", "cpu")


def batches(loader: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.cpu(), y.cpu()) for x, y in loader]  # type: ignore[attr-defined]


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert x.shape == wx.shape and x.dtype == wx.dtype == torch.float32
        assert torch.allclose(x, wx, rtol=1e-5, atol=1e-6)
        assert y.dtype == wy.dtype == torch.int64 and torch.equal(y, wy)


def test_dali_batches_equal_the_dataloader_batches(dataset: Path, ctx: DistContext) -> None:
    dali = functions.FUNCTIONS.build_data(make_cfg("data.loader=dali", "data.num_workers=2"), dataset, ctx, seed=7)
    torch_data = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=7)
    assert (dali.train_samples, dali.eval_samples) == (torch_data.train_samples, torch_data.eval_samples)
    assert (
        (len(dali.train), len(dali.validation))
        == (len(torch_data.train), len(torch_data.validation))
        == (2, 2)
    )
    for epoch in (1, 2):  # the loop numbers epochs from 1; each reshuffles as DistributedSampler does
        torch_data.set_epoch(epoch)
        assert_same(batches(dali.train), batches(torch_data.train))
    assert_same(batches(dali.validation), batches(torch_data.validation))  # 5 samples: a partial batch


def test_dali_reads_the_numpy_variant(tmp_path: Path, ctx: DistContext) -> None:
    cfg = make_cfg("data.format=numpy", "data.loader=dali")
    root = data.generate(cfg, tmp_path / "npy", seed=2)
    dali = functions.FUNCTIONS.build_data(cfg, root, ctx, seed=7)
    torch_data = functions.FUNCTIONS.build_data(make_cfg("data.format=numpy"), root, ctx, seed=7)
    assert_same(batches(dali.validation), batches(torch_data.validation))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_pipeline_matches_cpu(dataset: Path, ctx: DistContext) -> None:
    gpu_ctx = dataclasses.replace(ctx, device=torch.device("cuda", 0))
    gpu = functions.FUNCTIONS.build_data(make_cfg("data.loader=dali"), dataset, gpu_ctx, seed=3)
    cpu = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3)
    cpu.set_epoch(1)
    assert_same(batches(gpu.train), batches(cpu.train))
