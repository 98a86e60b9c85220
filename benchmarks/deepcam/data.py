"""DeepCAM data: the reference's one-HDF5-file-per-sample layout, or the optimized submissions' numpy.

<root>/stats.h5                          climate/minval, climate/maxval: (C,) per-channel range
<root>/{train,validation}/data-*.h5      climate/data (H, W, C) float32, climate/labels_0 (H, W) class ids
<root>/{train,validation}/data-*.npy     format=numpy: (H, W, C) float32, beside label-*.npy (H, W)
Fields are min-max normalised with stats.h5, x = (x - minval) / (maxval - minval), then channels first.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.benchmarks.deepcam.model import NUM_CLASSES
from mlhpc.benchmarks.deepcam.synthetic import FIELD_DTYPE, LABEL_DTYPE, write_dataset
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.data_kinds import hint as layout_hint
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.datasets import existing_data_dir, list_samples, open_h5, open_sample
from mlhpc.common.safeio.npyfile import check_npy
from mlhpc.common.training.batches import to_device
from mlhpc.common.training.loaders import torch_data_bundle

SPLITS = ("train", "validation")
STATS_FILE = "stats.h5"
DATA_KEY = "climate/data"
LABEL_KEY = "climate/labels_0"
MIN_KEY = "climate/minval"
MAX_KEY = "climate/maxval"
LABEL_DTYPES = tuple(np.dtype(t) for t in ("<i4", "<i8", "<u1", "<f4"))
"""Label dtypes read from .npy files; the class ids themselves are checked in HDF5 files."""


def generate(cfg: DeepCamConfig, out_dir: Path, num_samples: int | None = None, seed: int = 0) -> Path:
    """Write train/, validation/ and stats.h5 in the real layout; `num_samples` overrides the train count."""
    num_train = num_samples if num_samples is not None else cfg.data.num_train_samples
    ratio = cfg.data.num_eval_samples / cfg.data.num_train_samples
    num_eval = max(1, round(num_train * ratio)) if num_samples is not None else cfg.data.num_eval_samples
    return write_dataset(
        Path(out_dir),
        height=cfg.data.height,
        width=cfg.data.width,
        channels=cfg.data.num_channels,
        counts={"train": num_train, "validation": num_eval},
        file_format=cfg.data.format,
        seed=seed,
    )


def sample_bytes(cfg: DeepCamConfig) -> int:
    """Bytes of one sample on disk: its float32 (H, W, C) fields and int32 (H, W) class map, the
    payload of one HDF5 file (format=hdf5, a few KiB of metadata besides) or two .npy files (numpy,
    128-byte headers besides); stats.h5 is per dataset, not per sample."""
    pixels = cfg.data.height * cfg.data.width
    return pixels * (cfg.data.num_channels * FIELD_DTYPE.itemsize + LABEL_DTYPE.itemsize)


# ---------------------------------------------------------------- files and their checks
def sample_files(split_dir: Path, file_format: str) -> list[tuple[Path, Path | None]]:
    """(data, label) paths of one split in name order; HDF5 keeps both in one file (label None).
    DataError for a sample that is not a regular file (a FIFO would block every reader)."""
    if not split_dir.is_dir():
        raise DataError(
            f"{split_dir} does not exist; the dataset needs train/ and validation/ folders "
            "(run `mlhpc generate deepcam --out DIR` for synthetic data)"
        )
    suffix = ".h5" if file_format == "hdf5" else ".npy"
    prefixes = ("data-",) if file_format == "hdf5" else ("data-", "label-")
    present = list_samples(split_dir, lambda name: name.startswith(prefixes) and name.endswith(suffix))
    data_names = [name for name in present if name.startswith("data-")]  # in name order
    if file_format == "hdf5":
        pairs: list[tuple[Path, Path | None]] = [(present[name], None) for name in data_names]
    else:
        pairs = []
        for name in data_names:
            label_name = "label-" + name[len("data-") :]
            if label_name not in present:
                raise DataError(f"{present[name]} has no {label_name} beside it; regenerate or restage it")
            pairs.append((present[name], present[label_name]))
    if not pairs:
        raise DataError(
            f"{split_dir} holds no data-*{suffix} files; check --data and data.format={file_format}, "
            "or regenerate the dataset"
        )
    return pairs


# What hand-damaged HDF5 raises in h5py: OSError for a bad signature or a truncated chunk,
# KeyError/ValueError/TypeError/RuntimeError for damaged metadata or a dataset of another kind.
_H5_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def _dataset(handle: h5py.File, key: str, path: Path, fix: str) -> h5py.Dataset:
    """`handle[key]` when it is a dataset (not a group, a link to nowhere, or missing)."""
    item = handle.get(key)
    if not isinstance(item, h5py.Dataset):
        what = "no" if item is None else f"a {type(item).__name__.lower()} where it needs a"
        raise DataError(f"{path} has {what} {key} dataset; {fix}")
    return item


def read_stats(data_dir: Path, num_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) of the min-max normalisation, shaped (C, 1, 1) for channels-first fields."""
    path = Path(data_dir) / STATS_FILE
    fix = "regenerate the stats file"
    try:
        with open_h5(path) as handle:
            minval = np.asarray(_dataset(handle, MIN_KEY, path, fix)[...], dtype=np.float64)
            maxval = np.asarray(_dataset(handle, MAX_KEY, path, fix)[...], dtype=np.float64)
    except FileNotFoundError as e:
        raise DataError(
            f"{path} is missing; the dataset root needs the per-channel {STATS_FILE}"
            f"{layout_hint(Path(data_dir), 'deepcam')}"
        ) from e
    except _H5_ERRORS as e:
        raise DataError(f"{path} is not a readable HDF5 file ({_first_line(e)}); {fix}") from e
    for key, values in ((MIN_KEY, minval), (MAX_KEY, maxval)):
        if values.shape != (num_channels,):
            raise DataError(
                f"{path}: {key} has shape {list(values.shape)} but the data have {num_channels} "
                "channels; use the stats file of this dataset"
            )
    flat = np.flatnonzero(~(maxval > minval) | ~np.isfinite(maxval - minval))
    if flat.size:
        raise DataError(
            f"{path}: channel {flat[0]} has maxval <= minval or a non-finite range; regenerate the stats file"
        )
    shift = minval.astype(np.float32).reshape(-1, 1, 1)
    scale = (1.0 / (maxval - minval)).astype(np.float32).reshape(-1, 1, 1)
    return shift, scale


def check_hdf5_sample(path: Path, shape: tuple[int, int, int]) -> None:
    """Open one sample file: readable, both datasets there, right shapes, class ids in range."""
    fix = "restage or regenerate it"
    try:
        with open_h5(path) as handle:
            data, label = (_dataset(handle, key, path, fix) for key in (DATA_KEY, LABEL_KEY))
            if data.shape != shape or data.dtype.kind != "f":
                raise DataError(
                    f"{path}: {DATA_KEY} holds {data.dtype}{list(data.shape or ())}, expected float32"
                    f"{list(shape)}; regenerate it or set data.height / data.width / data.num_channels"
                )
            if label.shape != shape[:2] or label.dtype.kind not in "iuf":
                raise DataError(
                    f"{path}: {LABEL_KEY} holds {label.dtype}{list(label.shape or ())}, expected integer "
                    f"class ids{list(shape[:2])}; regenerate or restage it"
                )
            check_class_ids(path, label[...])
            _ = data[-1, -1]  # the last pixel: a file cut short fails here, not in training
    except FileNotFoundError as e:
        raise DataError(f"{path} is listed but missing; {fix}") from e
    except _H5_ERRORS as e:
        raise DataError(f"{path} is not a readable HDF5 file ({_first_line(e)}); {fix}") from e


def check_class_ids(path: Path, label: np.ndarray) -> None:
    """Every pixel is 0 (background), 1 (tropical cyclone) or 2 (atmospheric river)."""
    bad = (label < 0) | (label >= NUM_CLASSES) | (label != np.floor(label))
    if bad.any():
        y, x = np.argwhere(bad)[0]
        raise DataError(
            f"{path}: label class id {label[y, x]} at pixel ({y}, {x}) is out of range; "
            f"classes are 0..{NUM_CLASSES - 1} (background, tropical cyclone, atmospheric river); "
            "fix the labels, or regenerate or restage the file"
        )


def validate_dataset(cfg: DeepCamConfig, data_dir: Path) -> None:
    """Check the stats file and every sample (datasets, shapes, class ids) before any training."""
    data_dir = existing_data_dir(data_dir, "deepcam")
    shape = (cfg.data.height, cfg.data.width, cfg.data.num_channels)
    read_stats(data_dir, cfg.data.num_channels)
    pairs = [pair for split in SPLITS for pair in sample_files(data_dir / split, cfg.data.format)]
    fix = "regenerate it or set data.height / data.width / data.num_channels to match"

    def check(pair: tuple[Path, Path | None]) -> None:
        data_path, label_path = pair
        if label_path is None:
            check_hdf5_sample(data_path, shape)
            return
        check_npy(data_path, shape, np.dtype("<f4"), fix=fix)
        check_npy(label_path, shape[:2], LABEL_DTYPES, fix=fix)
        check_class_ids(label_path, _load_npy(label_path))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(check, pairs))


def _load_npy(path: Path) -> np.ndarray:
    with open_sample(path) as handle:
        return np.load(handle, allow_pickle=False)


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# ---------------------------------------------------------------- torch loading
class DeepCamFiles(Dataset):
    """One split; returns (normalised channels-first float32 fields, int64 class map)."""

    def __init__(self, split_dir: Path, *, file_format: str, stats: tuple[np.ndarray, np.ndarray]) -> None:
        self.pairs = sample_files(Path(split_dir), file_format)
        self.shift, self.scale = stats

    def __len__(self) -> int:
        return len(self.pairs)

    def sample_files(self, index: int) -> tuple[Path, ...]:
        """The files sample `index` is read from (an overlapped staging copies them first)."""
        return tuple(path for path in self.pairs[index] if path is not None)

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The raw (H, W, C) fields and (H, W) labels of one sample, as stored."""
        data_path, label_path = self.pairs[index]
        try:
            if label_path is None:
                with open_h5(data_path) as handle:
                    return handle[DATA_KEY][...], handle[LABEL_KEY][...]
            return _load_npy(data_path), _load_npy(label_path)
        except (*_H5_ERRORS, EOFError) as e:
            raise DataError(f"{data_path} cannot be read ({_first_line(e)}); regenerate or restage it") from e

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        data, label = self.read(index)
        fields = (np.transpose(data, (2, 0, 1)) - self.shift) * self.scale
        return torch.from_numpy(np.ascontiguousarray(fields, dtype=np.float32)), torch.from_numpy(
            label.astype(np.int64)
        )


def build_torch_data(cfg: DeepCamConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    """Train and validation DataLoaders for this rank over the files (data.loader=torch)."""
    stats = read_stats(Path(data_dir), cfg.data.num_channels)
    train = DeepCamFiles(Path(data_dir) / "train", file_format=cfg.data.format, stats=stats)
    validation = DeepCamFiles(Path(data_dir) / "validation", file_format=cfg.data.format, stats=stats)
    return torch_data_bundle(
        train, validation, loop=cfg.loop, ctx=ctx, seed=seed, num_workers=cfg.data.num_workers, where=data_dir
    )


# ---------------------------------------------------------------- the metric
def iou_per_sample(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N,) mean IoU over the classes of each sample, as the reference's `compute_score`:
    a class absent from both the prediction and the target of a sample counts as IoU 1."""
    # Imported here: torchmetrics takes seconds to import, and every `mlhpc` command registers deepcam.
    from torchmetrics.functional.segmentation import mean_iou

    scores = mean_iou(prediction, target, num_classes=NUM_CLASSES, per_class=True, input_format="index")
    classes = torch.arange(NUM_CLASSES, device=target.device)

    def present(class_map: torch.Tensor) -> torch.Tensor:  # (N, classes): class in the sample?
        return (class_map.flatten(1)[..., None] == classes).any(dim=1)

    seen = present(prediction) | present(target)
    return torch.where(seen, scores.to(torch.float64), 1.0).mean(dim=1)


def evaluate(model: torch.nn.Module, loader: object, ctx: DistContext) -> float:
    """Mean over every validation sample of all ranks of its class-mean IoU (MLLOG eval_accuracy)."""
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for batch in loader:
        fields, target = to_device(batch, ctx.device)
        prediction = model(fields).argmax(dim=1)
        totals[0] += iou_per_sample(prediction, target).double().sum()
        totals[1] += target.shape[0]
    ctx.all_reduce_sum(totals)
    return (totals[0] / totals[1].clamp(min=1)).item()
