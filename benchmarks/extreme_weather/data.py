"""ExtremeWeather data: the published HDF5 layout, its checks and the loader (the mAP evaluation is
evaluation.py's).

<root>/{train,validation}/climo_<year>.h5   one file per year (1,460 snapshots in the published set)
    images  (N, 16, H, W) float32   channels in the order of `synthetic.CHANNELS`
    boxes   (N, 15, 5)    integer   rows [ymin, xmin, ymax, xmax, class], unused rows all -1
<root>/stats.h5   mean, std (16,) float64 per channel over the training images (ours; optional)
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Subset

from mlhpc.benchmarks.extreme_weather import synthetic
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.benchmarks.extreme_weather.model import NUM_CLASSES
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.data_kinds import hint as layout_hint
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.datasets import existing_data_dir, list_samples, open_h5
from mlhpc.common.training.loaders import OneLineLoader

SPLITS = ("train", "validation")
IMAGES = "images"
BOXES = "boxes"
STATS_FILE = "stats.h5"
FILE_GLOB = "climo_*.h5"
FIRST_YEAR = 1979
IMAGE_DTYPE = np.dtype("<f4")
BOX_DTYPE = np.dtype("<i4")
"""The dtypes of `images` and `boxes` as the generator writes them."""
# Without stats.h5, the channel statistics come from at most this many training snapshots.
STATS_SAMPLE_IMAGES = 64

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------- generator
def generate(cfg: ExtremeWeatherConfig, out_dir: Path, num_samples: int | None = None, seed: int = 0) -> Path:
    """Write train/, validation/ and stats.h5 in the published layout; `num_samples` overrides the train count."""
    d = cfg.data
    out_dir = Path(out_dir)
    num_train = num_samples if num_samples is not None else d.num_train_samples
    ratio = d.num_eval_samples / d.num_train_samples
    num_eval = max(1, round(num_train * ratio)) if num_samples is not None else d.num_eval_samples
    year = FIRST_YEAR
    for split, count, offset in (("train", num_train, 0), ("validation", num_eval, 1)):
        split_dir = out_dir / split
        split_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, offset])
        for start in range(0, count, d.samples_per_file):
            n = min(d.samples_per_file, count - start)
            _write_year(split_dir / f"climo_{year}.h5", rng, n, cfg)
            year += 1
    mean, std = channel_stats(sorted((out_dir / "train").glob(FILE_GLOB)), max_images=None)
    tmp = out_dir / f".{STATS_FILE}.tmp"
    with h5py.File(tmp, "w") as h5:
        h5["mean"], h5["std"] = mean, std
    tmp.replace(out_dir / STATS_FILE)
    return out_dir


def sample_bytes(cfg: ExtremeWeatherConfig) -> int:
    """Bytes of one snapshot on disk: its float32 (C, H, W) image and its int32 (max_boxes, 5) box
    rows, the payload inside a year file of `samples_per_file` snapshots (the file's HDF5
    metadata and chunk index, a few KiB a file, aside)."""
    d = cfg.data
    image = d.num_channels * d.height * d.width * IMAGE_DTYPE.itemsize
    return image + d.max_boxes * 5 * BOX_DTYPE.itemsize


def _write_year(path: Path, rng: np.random.Generator, count: int, cfg: ExtremeWeatherConfig) -> None:
    d = cfg.data
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as h5:
        images = h5.create_dataset(
            IMAGES,
            (count, d.num_channels, d.height, d.width),
            dtype=IMAGE_DTYPE,
            chunks=(1, d.num_channels, d.height, d.width),
        )
        boxes = np.empty((count, d.max_boxes, 5), dtype=BOX_DTYPE)
        for i in range(count):
            image, boxes[i] = synthetic.snapshot(rng, d.height, d.width, d.max_boxes)
            images[i] = _channels(image, d.num_channels)
        h5[BOXES] = boxes
    tmp.replace(path)


def _channels(image: np.ndarray, count: int) -> np.ndarray:
    """The generator draws the 16 published channels; a config with fewer keeps the first ones."""
    if count <= image.shape[0]:
        return image[:count]
    return np.concatenate([image, np.zeros((count - image.shape[0], *image.shape[1:]), image.dtype)])


def channel_stats(files: list[Path], max_images: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std over the snapshots of `files` (evenly spaced, at most `max_images`)."""
    index = [(f, i) for f in files for i in range(_count(f))]
    if max_images is not None and len(index) > max_images:
        index = [index[round(k)] for k in np.linspace(0, len(index) - 1, max_images)]
    total = sq = None
    pixels = 0
    for path, i in index:
        with open_h5(path) as h5:
            image = h5[IMAGES][i].astype(np.float64)
        flat = image.reshape(image.shape[0], -1)
        total = flat.sum(1) if total is None else total + flat.sum(1)
        sq = (flat**2).sum(1) if sq is None else sq + (flat**2).sum(1)
        pixels += flat.shape[1]
    if total is None or sq is None:
        raise DataError(
            f"no training snapshots in {', '.join(map(str, files)) or 'train/'} to take statistics from"
        )
    mean = total / pixels
    std = np.sqrt(np.maximum(sq / pixels - mean**2, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def _count(path: Path) -> int:
    with open_h5(path) as h5:
        return int(h5[IMAGES].shape[0])


# ---------------------------------------------------------------- checks
@dataclass
class BoxFilter:
    """What `clean_boxes` did to a file's rows: the documented filter of bad boxes."""

    kept: int = 0
    clipped: int = 0
    """Boxes reaching past the image edge, clipped to it."""
    dropped_outside: int = 0
    """Boxes with no area inside the image, dropped."""
    dropped_empty: int = 0
    """Boxes of zero area (ymax <= ymin or xmax <= xmin), dropped."""
    first_dropped: list[str] = field(default_factory=list)

    def add(self, other: BoxFilter) -> None:
        self.kept += other.kept
        self.clipped += other.clipped
        self.dropped_outside += other.dropped_outside
        self.dropped_empty += other.dropped_empty
        self.first_dropped = (self.first_dropped + other.first_dropped)[:3]

    @property
    def dropped(self) -> int:
        return self.dropped_outside + self.dropped_empty


def clean_boxes(
    rows: np.ndarray, height: int, width: int, where: str, report: BoxFilter
) -> tuple[np.ndarray, np.ndarray]:
    """One image's padded rows -> (boxes (n, 4) xyxy float32, labels (n,) int64 = class + 1).

    Padding rows (all -1) are skipped. A class id outside 0..3 is a DataError. A box reaching past
    the edge is clipped; one with no area (inverted, or wholly outside) is dropped and counted.
    """
    boxes, labels = [], []
    for r, row in enumerate(rows):
        if np.all(row == synthetic.PAD):
            continue
        if not np.all(np.isfinite(row)):
            raise DataError(
                f"{where} box row {r} holds a non-finite value {row.tolist()}; fix or drop the row"
            )
        cls = int(row[4])
        if cls != row[4] or not 0 <= cls < NUM_CLASSES:
            raise DataError(
                f"{where} box row {r} has class id {row[4]}; the classes are 0..{NUM_CLASSES - 1} "
                "(tropical depression, tropical cyclone, extratropical cyclone, atmospheric river)"
            )
        ymin, xmin, ymax, xmax = (float(v) for v in row[:4])
        if ymax <= ymin or xmax <= xmin:
            report.dropped_empty += 1
            report.first_dropped.append(f"{where} row {r} (zero area)")
            continue
        cy = (max(ymin, 0.0), max(xmin, 0.0), min(ymax, height), min(xmax, width))
        if cy[2] <= cy[0] or cy[3] <= cy[1]:
            report.dropped_outside += 1
            report.first_dropped.append(f"{where} row {r} (outside the {height}x{width} image)")
            continue
        report.clipped += cy != (ymin, xmin, ymax, xmax)
        report.kept += 1
        boxes.append((cy[1], cy[0], cy[3], cy[2]))  # torchvision wants x1, y1, x2, y2
        labels.append(cls + 1)  # torchvision's label 0 is the background
    return (
        np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        np.asarray(labels, dtype=np.int64),
    )


def check_file(path: Path, cfg: ExtremeWeatherConfig) -> tuple[int, np.ndarray]:
    """Open one year file and check its datasets; returns (snapshots, boxes array). DataError if wrong."""
    d = cfg.data
    try:
        with open_h5(path) as h5:
            missing = [k for k in (IMAGES, BOXES) if not isinstance(h5.get(k), h5py.Dataset)]
            if missing:
                raise DataError(
                    f"{path} has no dataset {missing[0]!r}; an ExtremeWeather file holds "
                    f"'{IMAGES}' (N, {d.num_channels}, H, W) and '{BOXES}' (N, {d.max_boxes}, 5)"
                )
            images, boxes = h5[IMAGES], np.asarray(h5[BOXES][()])
            shape = tuple(images.shape or ())
            for key, kind in ((IMAGES, images.dtype.kind), (BOXES, boxes.dtype.kind)):
                if kind not in "fiu":
                    raise DataError(f"{path} '{key}' does not hold numbers; regenerate or restage it")
            if len(shape) == 4 and shape[0]:
                _ = images[-1, -1, -1, -1]  # a file cut short fails here, not in training
    except FileNotFoundError as e:
        raise DataError(f"{path} is listed but missing; regenerate or restage it") from e
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise DataError(
            f"{path} is not a readable HDF5 file ({_first_line(e)}); regenerate or restage it"
        ) from e
    expected = (d.num_channels, d.height, d.width)
    if len(shape) != 4 or shape[1:] != expected:
        got = "x".join(map(str, shape[1:])) if len(shape) == 4 else f"shape {list(shape)}"
        what = "channels" if len(shape) == 4 and shape[1] != d.num_channels else "snapshot shape"
        raise DataError(
            f"{path} '{IMAGES}' holds {got} per snapshot, expected {'x'.join(map(str, expected))} "
            f"(wrong {what}); set data.num_channels / data.height / data.width to match or regenerate"
        )
    if boxes.ndim != 3 or boxes.shape[0] != shape[0] or boxes.shape[2] != 5:
        raise DataError(
            f"{path} '{BOXES}' has shape {list(boxes.shape)}, expected [{shape[0]}, rows, 5] "
            "(ymin, xmin, ymax, xmax, class per row)"
        )
    return shape[0], boxes


def split_files(data_dir: Path, split: str) -> list[Path]:
    """The year files of one split, in name order; DataError for one that is not a regular file."""
    folder = Path(data_dir) / split
    files = (
        list(list_samples(folder, lambda name: fnmatch.fnmatchcase(name, FILE_GLOB)).values())
        if folder.is_dir()
        else []
    )
    if not files:
        raise DataError(
            f"{folder} holds no {FILE_GLOB} file; run `mlhpc generate extreme_weather --out DIR` "
            "or point --data at the ExtremeWeather year files split into train/ and validation/"
            f"{layout_hint(Path(folder).parent, 'extreme_weather')}"
        )
    return files


def validate_dataset(cfg: ExtremeWeatherConfig, data_dir: Path) -> None:
    """Check every file's datasets, shapes and box rows before any time is spent training."""
    data_dir = existing_data_dir(data_dir, "extreme_weather")
    for split in SPLITS:
        for path in split_files(data_dir, split):
            count, boxes = check_file(path, cfg)
            report = BoxFilter()
            for i in range(count):
                clean_boxes(boxes[i], cfg.data.height, cfg.data.width, f"{path} index {i}", report)


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# ---------------------------------------------------------------- torch loading
class ExtremeWeatherFiles(Dataset):
    """One split: (normalized (C, H, W) float32 snapshot, {"boxes", "labels"}) per index."""

    def __init__(self, split_dir: Path, cfg: ExtremeWeatherConfig, mean: np.ndarray, std: np.ndarray) -> None:
        self.files = split_files(split_dir.parent, split_dir.name)
        self.index: list[tuple[int, int]] = []
        self.targets: list[tuple[np.ndarray, np.ndarray]] = []
        self.filter = BoxFilter()
        for f, path in enumerate(self.files):
            count, boxes = check_file(path, cfg)
            for i in range(count):
                self.index.append((f, i))
                self.targets.append(
                    clean_boxes(boxes[i], cfg.data.height, cfg.data.width, f"{path} index {i}", self.filter)
                )
        self.mean = mean.astype(np.float32)[:, None, None]
        self.std = std.astype(np.float32)[:, None, None]
        self._handles: dict[int, h5py.File] = {}

    def __len__(self) -> int:
        return len(self.index)

    def sample_files(self, k: int) -> tuple[Path, ...]:
        """The year file snapshot `k` is read from (an overlapped staging copies it first)."""
        return (self.files[self.index[k][0]],)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        f, i = self.index[k]
        # Opened lazily so that each DataLoader worker has its own handle (h5py handles do not fork).
        if f not in self._handles:
            self._handles[f] = open_h5(self.files[f])
        image = self._handles[f][IMAGES][i]
        if not np.isfinite(image).all():
            channel = int(np.argwhere(~np.isfinite(image))[0][0])
            raise DataError(
                f"{self.files[f]} index {i} has NaN or Inf values (first in channel {channel}, "
                f"{synthetic.CHANNELS[channel] if channel < len(synthetic.CHANNELS) else '?'}); "
                "fix the snapshot or remove it from the split"
            )
        boxes, labels = self.targets[k]
        x = (image.astype(np.float32) - self.mean) / self.std
        return torch.from_numpy(x), {"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels)}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}}


def collate(samples: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> tuple[torch.Tensor, list[dict]]:
    """Fields share one size, so they stack; the targets stay a list (their box counts differ)."""
    return torch.stack([s[0] for s in samples]), [s[1] for s in samples]


def load_stats(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """stats.h5's per-channel mean and std, or the statistics of a sample of training snapshots."""
    path = Path(data_dir) / STATS_FILE
    if not path.exists():
        _log.warning(
            "%s is missing: normalizing with statistics of at most %d training snapshots",
            path,
            STATS_SAMPLE_IMAGES,
        )
        return channel_stats(split_files(data_dir, "train"), STATS_SAMPLE_IMAGES)
    try:
        with open_h5(path) as h5:
            mean, std = np.asarray(h5["mean"], np.float64), np.asarray(h5["std"], np.float64)
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        why = _first_line(e)
        raise DataError(f"{path} must hold datasets 'mean' and 'std' ({why}); regenerate or delete it") from e
    if mean.shape != std.shape or mean.ndim != 1 or not (np.isfinite(mean).all() and (std > 0).all()):
        raise DataError(f"{path}: mean and std must be finite (channels,) arrays with std > 0")
    return mean, std


def build_data(cfg: ExtremeWeatherConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    data_dir = Path(data_dir)
    mean, std = load_stats(data_dir)
    if mean.shape[0] != cfg.data.num_channels:
        raise DataError(
            f"{data_dir / STATS_FILE} has statistics for {mean.shape[0]} channels, the config "
            f"data.num_channels={cfg.data.num_channels}; regenerate the statistics"
        )
    train = ExtremeWeatherFiles(data_dir / "train", cfg, mean, std)
    validation = ExtremeWeatherFiles(data_dir / "validation", cfg, mean, std)
    for split, ds in (("train", train), ("validation", validation)):
        if ds.filter.dropped or ds.filter.clipped:
            _log.warning(
                "%s boxes: kept %d, clipped %d at the image edge, dropped %d outside the image and %d of "
                "zero area (first: %s)",
                split,
                ds.filter.kept,
                ds.filter.clipped,
                ds.filter.dropped_outside,
                ds.filter.dropped_empty,
                "; ".join(ds.filter.first_dropped) or "-",
            )
    if len(train) < cfg.loop.global_batch_size:
        raise DataError(
            f"{data_dir}/train has {len(train)} snapshots, fewer than loop.global_batch_size="
            f"{cfg.loop.global_batch_size}; generate more samples or lower the batch size"
        )
    batch = cfg.loop.local_batch_size(ctx.world_size)
    sampler = DistributedSampler(
        train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True
    )
    loader_args: dict[str, Any] = {
        "num_workers": cfg.data.num_workers,
        "pin_memory": ctx.device.type == "cuda",
        "persistent_workers": cfg.data.num_workers > 0,
        "collate_fn": collate,
    }
    # Disjoint, unpadded validation shards: the gathered mAP sees every snapshot once.
    shard = Subset(validation, range(ctx.rank, len(validation), ctx.world_size))
    return DataBundle(
        train=OneLineLoader(train, batch_size=batch, sampler=sampler, drop_last=True, **loader_args),
        validation=OneLineLoader(shard, batch_size=batch, shuffle=False, **loader_args),
        train_samples=len(train),
        eval_samples=len(validation),
        set_epoch=sampler.set_epoch,
    )
