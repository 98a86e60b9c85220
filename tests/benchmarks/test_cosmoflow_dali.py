"""The DALI CosmoFlow loader against the torch one, on a tiny generated dataset (CPU pipelines; one GPU test)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="nvidia-dali is not installed (pip install 'mlhpc[gpu]')")

from mlhpc.benchmarks.cosmoflow import data, functions
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.cluster.distributed import DistContext, init_distributed
from mlhpc.common.cluster.launch import detect_launch
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError, DataError

pytestmark = pytest.mark.dali

MINI = Path(data.__file__).parent / "configs" / "mini.yaml"
NUM_TRAIN, NUM_EVAL, SIZE = 24, 10, 16


def make_cfg(loader: str = "dali", global_batch_size: int = 4) -> CosmoFlowConfig:
    return load_config(
        CosmoFlowConfig,
        MINI,
        [
            f"data.num_train_samples={NUM_TRAIN}",
            f"data.num_eval_samples={NUM_EVAL}",
            f"loop.global_batch_size={global_batch_size}",
            f"data.loader={loader}",
        ],
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.generate(make_cfg(), tmp_path_factory.mktemp("cosmoflow"))


@pytest.fixture(scope="module")
def ctx() -> DistContext:
    # An empty environment is a plain process, whatever launcher runs pytest: a world of one.
    return init_distributed(device="cpu", launch=detect_launch({}))


def rank(ctx: DistContext, rank: int, world_size: int) -> DistContext:
    """Rank `rank` of a `world_size` job; building loaders needs no process group."""
    return dataclasses.replace(ctx, rank=rank, local_rank=rank, world_size=world_size)


def label_index(root: Path, split: str) -> dict[tuple[float, ...], int]:
    """Sample index by its 4 targets, which the generator draws at random and so are unique."""
    files = data.CosmoFlowFiles(root / split, apply_log=True)
    return {tuple(files[i][1].tolist()): i for i in range(len(files))}


def test_validation_matches_torch_loader(dataset: Path, ctx: DistContext) -> None:
    dali_batches = list(functions.FUNCTIONS.build_data(make_cfg("dali"), dataset, ctx, seed=3).validation)
    torch_batches = list(functions.FUNCTIONS.build_data(make_cfg("torch"), dataset, ctx, seed=3).validation)
    assert len(dali_batches) == len(torch_batches) == 3
    for (dali_cube, dali_target), (torch_cube, torch_target) in zip(dali_batches, torch_batches, strict=True):
        assert dali_cube.shape == torch_cube.shape and dali_cube.dtype == torch_cube.dtype == torch.float32
        assert torch.allclose(dali_cube, torch_cube, rtol=1e-6, atol=1e-6)
        assert torch.equal(dali_target, torch_target)


def test_train_yields_full_batches_of_distinct_samples(dataset: Path, ctx: DistContext) -> None:
    bundle = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3)
    assert (bundle.train_samples, bundle.eval_samples) == (NUM_TRAIN, NUM_EVAL)
    assert len(bundle.train) == NUM_TRAIN // 4
    files = data.CosmoFlowFiles(dataset / "train", apply_log=True)
    index = label_index(dataset, "train")
    orders = []
    for _epoch in range(2):
        batches = list(bundle.train)
        assert len(batches) == len(bundle.train)
        order = []
        for cube, target in batches:
            assert cube.shape == (4, 4, SIZE, SIZE, SIZE) and cube.dtype == torch.float32
            assert target.shape == (4, 4) and target.dtype == torch.float32
            for sample_cube, sample_target in zip(cube, target, strict=True):
                i = index[tuple(sample_target.tolist())]
                # The data and label readers must stay paired through the shuffle.
                assert torch.allclose(sample_cube, files[i][0], rtol=1e-6, atol=1e-6)
                order.append(i)
        assert sorted(order) == list(range(NUM_TRAIN))
        orders.append(order)
    assert orders[0] != orders[1], "the train reader should reshuffle between epochs"


def test_validation_yields_every_sample_once_per_epoch(dataset: Path, ctx: DistContext) -> None:
    bundle = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3)
    index = label_index(dataset, "validation")
    for _epoch in range(2):  # a reader that borrows from the next epoch would shift epoch 2
        batches = list(bundle.validation)
        assert [len(target) for _, target in batches] == [4, 4, 2] and len(bundle.validation) == 3
        order = [index[tuple(t.tolist())] for _, target in batches for t in target]
        assert order == list(range(NUM_EVAL))


def test_validation_shards_cover_every_sample_once(dataset: Path, ctx: DistContext) -> None:
    # 10 samples on 3 ranks of batch 3: shards of 3, 3 and 4 samples, so 1, 1 and 2 batches.
    cfg = make_cfg(global_batch_size=9)
    index = label_index(dataset, "validation")
    loaders = [functions.FUNCTIONS.build_data(cfg, dataset, rank(ctx, r, 3), seed=3).validation for r in range(3)]
    assert [len(loader) for loader in loaders] == [1, 1, 2]
    for _epoch in range(2):
        seen = []
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == len(loader)
            seen += [index[tuple(t.tolist())] for _, target in batches for t in target]
        assert sorted(seen) == list(range(NUM_EVAL))


def test_train_ranks_take_equal_steps_on_disjoint_samples(dataset: Path, ctx: DistContext) -> None:
    # 24 samples on 5 ranks of batch 1: shards of 4 or 5, and every rank must stop after 24 // 5 = 4.
    cfg = make_cfg(global_batch_size=5)
    index = label_index(dataset, "train")
    loaders = [functions.FUNCTIONS.build_data(cfg, dataset, rank(ctx, r, 5), seed=3).train for r in range(5)]
    assert [len(loader) for loader in loaders] == [4] * 5
    for _epoch in range(2):
        seen = []
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == 4
            seen += [index[tuple(t.tolist())] for _, target in batches for t in target]
        assert len(seen) == len(set(seen)) == 20


def test_abandoned_epoch_does_not_shift_the_next(dataset: Path, ctx: DistContext) -> None:
    loader = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3).validation
    full = [target for _, target in loader]
    next(iter(loader))
    again = [target for _, target in loader]
    assert all(torch.equal(a, b) for a, b in zip(full, again, strict=True))


def test_unreadable_file_is_a_data_error(tmp_path: Path, ctx: DistContext) -> None:
    root = data.generate(make_cfg(), tmp_path, num_samples=8)
    victim = sorted((root / "validation").glob("*_data.npy"))[0]
    victim.unlink()
    with pytest.raises(DataError, match=victim.name):
        functions.FUNCTIONS.build_data(make_cfg(), root, ctx, seed=3)


def test_missing_dali_is_a_config_error(
    dataset: Path, ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    with pytest.raises(ConfigError, match=r"pip install 'mlhpc\[gpu\]'"):
        functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_pipeline_matches_cpu(dataset: Path, ctx: DistContext) -> None:
    gpu_ctx = dataclasses.replace(ctx, device=torch.device("cuda", 0))
    cpu = functions.FUNCTIONS.build_data(make_cfg(), dataset, ctx, seed=3)
    gpu = functions.FUNCTIONS.build_data(make_cfg(), dataset, gpu_ctx, seed=3)
    for split in ("train", "validation"):
        cpu_batches = list(getattr(cpu, split))
        gpu_batches = list(getattr(gpu, split))
        assert len(gpu_batches) == len(cpu_batches) == len(getattr(gpu, split))
        for (gpu_cube, gpu_target), (cpu_cube, cpu_target) in zip(gpu_batches, cpu_batches, strict=True):
            assert gpu_cube.device.type == gpu_target.device.type == "cuda"
            assert torch.allclose(gpu_cube.cpu(), cpu_cube, rtol=1e-5, atol=1e-6)
            assert torch.equal(gpu_target.cpu(), cpu_target)
