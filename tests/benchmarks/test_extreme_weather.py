"""Extreme weather: generator and loader round trip, bad input, mAP on a hand case, VFLOPS arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from mlhpc.benchmarks.extreme_weather import data, evaluation, synthetic, train
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract import registry
from mlhpc.common.contract.catalog import required_run_count
from mlhpc.common.contract.config import load_config
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import ConfigError, DataError
from mlhpc.submission_checker import hpc_ai500

SMALL = ["data.height=64", "data.width=96", "data.num_train_samples=12", "data.num_eval_samples=4"]


@pytest.fixture
def ew_cfg() -> Callable[..., ExtremeWeatherConfig]:
    def make(*overrides: str, name: str = "mini") -> ExtremeWeatherConfig:
        bench = registry.get("extreme_weather")
        return load_config(ExtremeWeatherConfig, bench.config_path(name), overrides)

    return make


@pytest.fixture
def cpu() -> DistContext:
    return DistContext(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        num_nodes=1,
        device=torch.device("cpu"),
        backend="none",
        launcher="none",
    )


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bench = registry.get("extreme_weather")
    cfg = load_config(ExtremeWeatherConfig, bench.config_path("mini"), [*SMALL, "data.samples_per_file=8"])
    return data.generate(cfg, tmp_path_factory.mktemp("ew") / "data", seed=3)


def test_catalog_entry_gives_the_checker_its_run_count() -> None:
    bench = registry.get("extreme_weather")
    assert bench.info.strong_run_count == 5
    assert required_run_count("extreme_weather") == 5  # not in mlperf_logging: the catalog's
    assert (bench.target.metric, bench.target.direction) == ("eval_accuracy", "max")
    assert bench.run_end_events is train.run_end_events


def test_full_config_keeps_the_hpc_ai500_values(ew_cfg: Callable[..., ExtremeWeatherConfig]) -> None:
    cfg = ew_cfg(name="full")
    assert (cfg.data.num_channels, cfg.data.height, cfg.data.width, cfg.data.max_boxes) == (16, 768, 1152, 15)
    assert (cfg.loop.target, cfg.loop.max_epochs, cfg.model.backbone) == (0.35, 50, "resnet50")
    assert ew_cfg().loop.target == 0.35  # the rule file checks 0.35 for every log


def test_anchor_levels_must_match_the_fpn(ew_cfg: Callable[..., ExtremeWeatherConfig]) -> None:
    with pytest.raises(ConfigError, match=r"anchor_sizes has 4 entries but the FPN has 5 levels"):
        ew_cfg("model.returned_layers=[1, 2, 3, 4]")


def test_generated_files_have_the_published_layout(small_data: Path) -> None:
    train_files = sorted((small_data / "train").glob("climo_*.h5"))
    assert [p.name for p in train_files] == ["climo_1979.h5", "climo_1980.h5"]  # 12 snapshots, 8 per file
    with h5py.File(train_files[0], "r") as h5:
        assert sorted(h5) == ["boxes", "images"]
        assert h5["images"].shape == (8, 16, 64, 96) and h5["images"].dtype == np.float32
        boxes = h5["boxes"][()]
    assert boxes.shape == (8, 15, 5)
    used = boxes[boxes[..., 4] != synthetic.PAD]
    assert len(used) >= 8  # every snapshot has at least one event
    assert np.all(boxes[boxes[..., 4] == synthetic.PAD] == -1)  # padding rows are all -1
    ymin, xmin, ymax, xmax, cls = used.T
    assert np.all((ymin < ymax) & (xmin < xmax)) and np.all((cls >= 0) & (cls <= 3))
    assert ymax.max() <= 63 and xmax.max() <= 95  # y runs along the 64 axis, x along the 96 one
    with h5py.File(small_data / "stats.h5", "r") as h5:
        assert h5["mean"].shape == (16,) and np.all(np.asarray(h5["std"]) > 0)


def test_loader_round_trip_converts_rows_to_torchvision_targets(
    small_data: Path, ew_cfg: Callable[..., ExtremeWeatherConfig], cpu: DistContext
) -> None:
    cfg = ew_cfg(*SMALL, "loop.global_batch_size=4")
    data.validate_dataset(cfg, small_data)
    bundle: DataBundle = data.build_data(cfg, small_data, cpu, seed=1)
    assert (bundle.train_samples, bundle.eval_samples) == (12, 4)
    images, targets = next(iter(bundle.validation))
    assert images.shape == (4, 16, 64, 96) and images.dtype == torch.float32
    with h5py.File(small_data / "validation" / "climo_1981.h5", "r") as h5:
        rows, raw = h5["boxes"][0], h5["images"][0]
    rows = rows[rows[:, 4] != -1]
    # [ymin, xmin, ymax, xmax, class] -> [x1, y1, x2, y2], label class + 1
    expected = torch.tensor(rows[:, [1, 0, 3, 2]], dtype=torch.float32)
    torch.testing.assert_close(targets[0]["boxes"], expected)
    assert targets[0]["labels"].tolist() == [int(c) + 1 for c in rows[:, 4]]
    mean, std = data.load_stats(small_data)
    torch.testing.assert_close(
        images[0], torch.from_numpy(((raw - mean[:, None, None]) / std[:, None, None]).astype(np.float32))
    )


def _year_file(path: Path, images: np.ndarray, boxes: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        h5["images"], h5["boxes"] = images, boxes


def _copy_dataset(src: Path, dst: Path) -> Path:
    for path in src.rglob("*.h5"):
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return dst


def test_nan_snapshot_names_file_and_index(
    small_data: Path, tmp_path: Path, ew_cfg: Callable[..., ExtremeWeatherConfig], cpu: DistContext
) -> None:
    root = _copy_dataset(small_data, tmp_path / "d")
    with h5py.File(root / "validation" / "climo_1981.h5", "r+") as h5:
        h5["images"][2, 6, 10, 10] = np.nan
    bundle = data.build_data(ew_cfg(*SMALL, "loop.global_batch_size=4"), root, cpu, seed=1)
    with pytest.raises(
        DataError, match=r"climo_1981\.h5 index 2 has NaN or Inf values \(first in channel 6, TMQ\)"
    ):
        next(iter(bundle.validation))


def test_unknown_class_names_file_index_and_row(
    tmp_path: Path, ew_cfg: Callable[..., ExtremeWeatherConfig]
) -> None:
    cfg = ew_cfg(*SMALL)
    boxes = np.full((2, 15, 5), -1, np.int32)
    boxes[:, 0] = [4, 4, 20, 20, 1]
    boxes[1, 1] = [30, 30, 40, 40, 7]
    _year_file(tmp_path / "train" / "climo_1979.h5", np.zeros((2, 16, 64, 96), np.float32), boxes)
    _year_file(tmp_path / "validation" / "climo_1980.h5", np.zeros((2, 16, 64, 96), np.float32), boxes[:1])
    with pytest.raises(
        DataError, match=r"climo_1979\.h5 index 1 box row 1 has class id 7; the classes are 0\.\.3"
    ):
        data.validate_dataset(cfg, tmp_path)


def test_wrong_channel_count_is_one_line(tmp_path: Path, ew_cfg: Callable[..., ExtremeWeatherConfig]) -> None:
    _year_file(
        tmp_path / "train" / "climo_1979.h5", np.zeros((1, 12, 64, 96), np.float32), np.full((1, 15, 5), -1)
    )
    with pytest.raises(DataError) as info:
        data.validate_dataset(ew_cfg(*SMALL), tmp_path)
    message = str(info.value)
    assert "climo_1979.h5 'images' holds 12x64x96 per snapshot, expected 16x64x96 (wrong channels)" in message
    assert "\n" not in message


def test_bad_boxes_are_clipped_or_dropped_and_counted() -> None:
    rows = np.full((15, 5), -1, np.float32)
    rows[0] = [10, 10, 30, 40, 0]  # kept as is
    rows[1] = [50, 80, 70, 120, 2]  # past the right edge (96): clipped
    rows[2] = [20, 20, 20, 30, 1]  # zero height: dropped
    rows[3] = [70, 10, 90, 20, 3]  # below the image (64 rows): dropped
    report = data.BoxFilter()
    boxes, labels = data.clean_boxes(rows, 64, 96, "f.h5 index 0", report)
    np.testing.assert_array_equal(boxes, [[10, 10, 40, 30], [80, 50, 96, 64]])
    assert labels.tolist() == [1, 3]
    assert (report.kept, report.clipped, report.dropped_empty, report.dropped_outside) == (2, 1, 1, 1)
    assert report.first_dropped == [
        "f.h5 index 0 row 2 (zero area)",
        "f.h5 index 0 row 3 (outside the 64x96 image)",
    ]


def test_map_matches_a_hand_computed_case() -> None:
    """Class 1: two boxes, detections hit (0.9), miss (0.8), hit (0.7) -> precision 1 up to recall 0.5,
    then 2/3; COCO's 101-point interpolation gives AP = (51 + 50 * 2/3) / 101. Class 2: the only
    detection overlaps its box with IoU 0.4 < 0.5 -> AP 0. mAP@0.5 is their mean."""
    metric = evaluation.mean_average_precision()
    target = {
        "boxes": torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]], dtype=torch.float32),
        "labels": torch.tensor([1, 1, 2]),
    }
    prediction = {
        "boxes": torch.tensor(
            [[0, 0, 10, 10], [70, 70, 80, 80], [21, 21, 30, 30], [50, 50, 60, 54]], dtype=torch.float32
        ),
        "scores": torch.tensor([0.9, 0.8, 0.7, 0.95]),
        "labels": torch.tensor([1, 1, 1, 2]),
    }
    metric.update([prediction], [target])
    expected = ((51 + 50 * 2 / 3) / 101 + 0.0) / 2
    assert float(metric.compute()["map"]) == pytest.approx(expected, abs=1e-6)


def test_valid_flops_arithmetic() -> None:
    assert hpc_ai500.valid_flops(1e12, 0.35, 0.35, 5) == pytest.approx(1e12)
    assert hpc_ai500.valid_flops(1e12, 0.175, 0.35, 5) == pytest.approx(1e12 / 32)
    assert hpc_ai500.valid_flops(2e9, 0.42, 0.35, 5) == pytest.approx(2e9 * 1.2**5)
    with pytest.raises(ValueError, match="target quality 0"):
        hpc_ai500.valid_flops(1.0, 0.5, 0.0, 5)


# run_end_events: tests/benchmarks/test_hpc_ai500_source.py (Valid FLOPS over the run's time).


def test_lr_schedule_warms_up_then_decays(ew_cfg: Callable[..., ExtremeWeatherConfig]) -> None:
    cfg = ew_cfg()  # warm-up 2 epochs from 0.01, x0.1 at epochs 12 and 14
    assert train.lr_multiplier(cfg, 0.0) == pytest.approx(0.01)
    assert train.lr_multiplier(cfg, 1.0) == pytest.approx(0.505)
    assert train.lr_multiplier(cfg, 3.0) == 1.0
    assert train.lr_multiplier(cfg, 12.0) == pytest.approx(0.1)
    assert train.lr_multiplier(cfg, 14.5) == pytest.approx(0.01)
