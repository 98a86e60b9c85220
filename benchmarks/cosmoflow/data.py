"""CosmoFlow data: the per-sample numpy format of the MLPerf HPC PyTorch submissions.

<root>/{train,validation}/<name>_data.npy   (S, S, S, 4) int16 particle counts
<root>/{train,validation}/<name>_label.npy  (4,) float32 cosmology parameters in [-1, 1]
<root>/{train,validation}/files_data.lst, files_label.lst   sorted file names, one a line
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.benchmarks.cosmoflow.model import NUM_TARGETS
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.data_kinds import hint as layout_hint
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import DataError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.datasets import existing_data_dir, list_samples, open_sample
from mlhpc.common.safeio.npyfile import check_npy
from mlhpc.common.training.batches import to_device
from mlhpc.common.training.loaders import torch_data_bundle

SPLITS = ("train", "validation")
DATA_LIST = "files_data.lst"
LABEL_LIST = "files_label.lst"
DATA_DTYPE = np.dtype("<i2")
LABEL_DTYPE = np.dtype("<f4")


# ---------------------------------------------------------------- synthetic generator
def synthesize_sample(rng: np.random.Generator, size: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """One learnable sample: the 4 targets set the statistics of a log-normal Poisson field.

    All channels share one smooth random structure (as the 4 redshifts of a universe do); each
    target sets the mean density of one channel and the contrast of another, so a CNN can read it.
    """
    theta = rng.uniform(-1.0, 1.0, NUM_TARGETS).astype(np.float32)
    noise = rng.standard_normal((size, size, size))
    freq = np.fft.fftfreq(size)
    half = np.fft.rfftfreq(size)
    k2 = freq[:, None, None] ** 2 + freq[None, :, None] ** 2 + half[None, None, :] ** 2
    corr_len = max(1.0, size / 8)
    smooth = np.fft.irfftn(
        np.fft.rfftn(noise) * np.exp(-0.5 * k2 * (2 * np.pi * corr_len) ** 2), s=noise.shape, axes=(0, 1, 2)
    )
    smooth = (smooth - smooth.mean()) / (smooth.std() + 1e-12)  # exact moments: targets stay identifiable
    # Each target shifts the mean density of one channel and the contrast of the next.
    target_of_channel = np.arange(channels) % NUM_TARGETS
    mean = 1.0 + 0.9 * theta[target_of_channel]
    contrast = 0.5 + 0.25 * theta[(target_of_channel + 1) % NUM_TARGETS]
    rate = np.exp(mean + contrast * smooth[..., None])
    counts = np.clip(rng.poisson(rate), 0, np.iinfo(np.int16).max).astype(DATA_DTYPE)
    return counts, theta.astype(LABEL_DTYPE)


def generate(cfg: CosmoFlowConfig, out_dir: Path, num_samples: int | None = None, seed: int = 0) -> Path:
    """Write train/ and validation/ in the real format; `num_samples` overrides the train count."""
    out_dir = Path(out_dir)
    num_train = num_samples if num_samples is not None else cfg.data.num_train_samples
    ratio = cfg.data.num_eval_samples / cfg.data.num_train_samples
    num_eval = max(1, round(num_train * ratio)) if num_samples is not None else cfg.data.num_eval_samples
    for split, count, offset in (("train", num_train, 0), ("validation", num_eval, 1)):
        split_dir = out_dir / split
        split_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, offset])
        names = []
        for i in range(count):
            data, label = synthesize_sample(rng, cfg.data.sample_size, cfg.data.num_channels)
            name = f"cosmo_synth_{split}_{i:07d}"
            _save_npy(split_dir / f"{name}_data.npy", data)
            _save_npy(split_dir / f"{name}_label.npy", label)
            names.append(name)
        _write_list(split_dir / DATA_LIST, [f"{n}_data.npy" for n in names])
        _write_list(split_dir / LABEL_LIST, [f"{n}_label.npy" for n in names])
    return out_dir


def sample_bytes(cfg: CosmoFlowConfig) -> int:
    """Bytes of one sample on disk: its int16 (S, S, S, C) counts and 4 float32 targets, the two
    .npy files' payload (each file adds a 128-byte header)."""
    cube = cfg.data.sample_size**3 * cfg.data.num_channels * DATA_DTYPE.itemsize
    return cube + NUM_TARGETS * LABEL_DTYPE.itemsize


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
    tmp.replace(path)


def _write_list(path: Path, names: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{n}\n" for n in sorted(names)), encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------- validation of files
def read_file_lists(split_dir: Path) -> list[tuple[Path, Path]]:
    """(data, label) path pairs of one split, in list order; DataError if the lists are broken or
    name a file that is not in `split_dir` as a regular file (a FIFO would block every reader)."""
    present = list_samples(split_dir, lambda name: name.endswith((".npy", ".lst")))
    lists = []
    for name in (DATA_LIST, LABEL_LIST):
        path = split_dir / name
        if name not in present:
            raise DataError(
                f"{path} is missing; the dataset needs {DATA_LIST} and {LABEL_LIST} in "
                f"{split_dir} (run `mlhpc generate cosmoflow --out DIR` for synthetic data)"
                f"{layout_hint(split_dir.parent, 'cosmoflow')}"
            )
        lists.append(sorted(line.strip() for line in _read_list(path).splitlines() if line.strip()))
    data_names, label_names = lists
    if len(data_names) != len(label_names):
        raise DataError(
            f"{split_dir}: {DATA_LIST} lists {len(data_names)} files but {LABEL_LIST} "
            f"lists {len(label_names)}; every sample needs both"
        )
    if not data_names:
        raise DataError(f"{split_dir / DATA_LIST} lists no files; regenerate or restage the dataset")
    for name in (*data_names, *label_names):
        if name not in present:  # also a name with a folder in it, which could lead out of the split
            raise DataError(
                f"{shown(split_dir / name)} is listed but missing from {split_dir}; "
                "regenerate or restage the dataset"
            )
    return [(present[d], present[lab]) for d, lab in zip(data_names, label_names, strict=True)]


def _read_list(path: Path) -> str:
    try:
        with open_sample(path) as handle:
            return handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path} cannot be read as a list of file names ({e}); regenerate it") from e


def validate_dataset(cfg: CosmoFlowConfig, data_dir: Path) -> None:
    """Check every listed file's header and size before any time is spent training."""
    data_dir = existing_data_dir(data_dir, "cosmoflow")
    shape = (cfg.data.sample_size,) * 3 + (cfg.data.num_channels,)
    checks = []
    for split in SPLITS:
        for data_path, label_path in read_file_lists(data_dir / split):
            checks.append((data_path, shape, DATA_DTYPE))
            checks.append((label_path, (NUM_TARGETS,), LABEL_DTYPE))
    fix = "regenerate it or set data.sample_size / data.num_channels to match"
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda args: check_npy(*args, fix=fix), checks))


# ---------------------------------------------------------------- torch loading
class CosmoFlowFiles(Dataset):
    """One split read with np.load; returns (channels-first float32 cube, 4 targets)."""

    def __init__(self, split_dir: Path, *, apply_log: bool) -> None:
        self.pairs = read_file_lists(Path(split_dir))
        self.apply_log = apply_log

    def __len__(self) -> int:
        return len(self.pairs)

    def sample_files(self, index: int) -> tuple[Path, ...]:
        """The files sample `index` is read from (an overlapped staging copies them first)."""
        return self.pairs[index]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        data_path, label_path = self.pairs[index]
        data = _load(data_path)
        label = _load(label_path)
        cube = torch.from_numpy(data.astype(np.float32)).permute(3, 0, 1, 2).contiguous()
        if self.apply_log:
            cube = torch.log1p(cube)
        return cube, torch.from_numpy(label.astype(np.float32))


def _load(path: Path) -> np.ndarray:
    try:
        with open_sample(path) as handle:
            return np.load(handle, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{path} cannot be read ({e}); regenerate or restage it") from e


def build_torch_data(cfg: CosmoFlowConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    """Train and validation DataLoaders for this rank over the files (data.loader=torch)."""
    train = CosmoFlowFiles(Path(data_dir) / "train", apply_log=cfg.data.apply_log)
    validation = CosmoFlowFiles(Path(data_dir) / "validation", apply_log=cfg.data.apply_log)
    return torch_data_bundle(
        train,
        validation,
        loop=cfg.loop,
        ctx=ctx,
        seed=seed,
        num_workers=cfg.data.num_workers,
        where=data_dir,
    )


def evaluate(model: torch.nn.Module, loader: object, ctx: DistContext) -> float:
    """Mean absolute error over every validation sample and target, all ranks together."""
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for batch in loader:
        cube, target = to_device(batch, ctx.device)
        totals[0] += (model(cube).float() - target).abs().sum().double()
        totals[1] += target.numel()
    ctx.all_reduce_sum(totals)
    return (totals[0] / totals[1].clamp(min=1)).item()
