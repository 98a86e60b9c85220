"""How big a benchmark's synthetic dataset is, from its config alone, and sizes as people read and
type them (`43.0 MB` shown, `--allow-size 2TB` typed back)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

_MANIFEST_BYTES_PER_FILE = 200  # one manifest line per file: path, size, checksum


_NPY_HEADER = 128


_HDF5_FILE_BYTES = 4096  # superblock, object headers and the chunk index of a small HDF5 file


_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?)(b?)\s*\Z", re.IGNORECASE | re.ASCII)


def split_counts(data: Any, num_samples: int | None) -> tuple[int, int]:
    """(train, eval) samples a generator writes: the config's, or `num_samples` with the config's
    ratio (the rule every benchmark's `generate` follows)."""
    if num_samples is None:
        return data.num_train_samples, data.num_eval_samples
    return num_samples, max(1, round(num_samples * data.num_eval_samples / data.num_train_samples))


def dataset_bytes(benchmark: str, cfg: Any, num_samples: int | None = None) -> int | None:
    """About how many bytes `mlhpc generate` writes for this config (the data files, their
    headers and the manifest), from the config alone; None for a benchmark whose layout this
    does not know (a plugin's), whose generation then goes unchecked."""
    sizer = _SIZERS.get(benchmark)
    if sizer is None:
        return None
    train, evaluation = split_counts(cfg.data, num_samples)
    per_sample, files_per_sample, fixed = sizer(cfg.data)
    samples = train + evaluation
    return samples * (per_sample + files_per_sample * _MANIFEST_BYTES_PER_FILE) + fixed


def _cosmoflow(d: Any) -> tuple[int, int, int]:
    data = d.sample_size**3 * d.num_channels * 2 + _NPY_HEADER  # int16 counts
    label = 4 * 4 + _NPY_HEADER  # 4 float32 targets
    return data + label + 2 * 40, 2, 4096  # a line in each file list per sample; the lists' folders


def _deepcam(d: Any) -> tuple[int, int, int]:
    pixels = d.height * d.width
    data, label = pixels * d.num_channels * 4, pixels * 4  # float32 fields, int32 classes
    if d.format == "numpy":
        return data + label + 2 * _NPY_HEADER, 2, _HDF5_FILE_BYTES
    return data + label + _HDF5_FILE_BYTES, 1, _HDF5_FILE_BYTES  # stats.h5 besides


def _extreme_weather(d: Any) -> tuple[int, int, int]:
    image = d.num_channels * d.height * d.width * 4 + d.max_boxes * 5 * 4 + 64  # + its chunk's index entry
    return image, 0, 1000 * _HDF5_FILE_BYTES  # a file a year (1,460 samples): a bounded few


def _aiperf(d: Any) -> tuple[int, int, int]:
    # A JPEG of the generator's patterns at quality 90: measured 1.3 kB at 32 px, 35 kB at 256 px;
    # resolution² bytes errs high (2 kB, 66 kB), as a free-space check should. A folder a class.
    return d.resolution**2 + 1024, 1, 4096 * 2 * d.classes


_SIZERS: dict[str, Callable[[Any], tuple[int, int, int]]] = {
    "aiperf": _aiperf,
    "cosmoflow": _cosmoflow,
    "deepcam": _deepcam,
    "extreme_weather": _extreme_weather,
}
"""bytes per sample, files per sample, bytes per dataset: each built-in generator's layout."""


def human_size(count: int, *, round_up: bool = True) -> str:
    """`9.9 TB`, `417 MB` (decimal units); rounded up by default, so that a size shown to a person
    and typed back as --allow-size covers the real one; `round_up=False` for free space."""
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    count = int(count)
    power = 0
    while power < len(units) - 1 and count >= 1000 ** (power + 1):
        power += 1
    scale = 1000**power if power == 0 or count >= 100 * 1000**power else 1000**power // 10
    whole = -(-count // scale) if round_up else count // scale  # integers: exact at every size
    text = str(whole) if scale == 1000**power else f"{whole // 10}.{whole % 10}"
    return f"{text} {units[power]}"


MAX_SIZE_BYTES = 10**18
"""An exabyte: more than any node-local or shared disk a size is typed for; a 400-digit size
overflowed float to inf (a traceback)."""


def parse_size(text: str) -> int:
    """`9.9TB`, `500 GB`, `4GiB`, `1000000` -> bytes, at most MAX_SIZE_BYTES; ValueError naming the
    fix otherwise."""
    match = _SIZE.match(text) if len(text) <= 40 else None
    if not match:
        raise ValueError(f"{text[:40]!r} is not a size; write it as 9.9TB, 500GB or 4GiB")
    number, prefix, binary, _ = match.groups()
    scale = _UNITS[prefix.lower()]
    if binary:
        if not prefix:
            raise ValueError(f"{text[:40]!r} is not a size; write it as 9.9TB, 500GB or 4GiB")
        scale = 2 ** (10 * "kmgtp".index(prefix.lower()) + 10)
    size = float(number) * scale
    if not size <= MAX_SIZE_BYTES:
        raise ValueError(
            f"{text.strip()!r} is more than any disk ({human_size(MAX_SIZE_BYTES)}); write e.g. 9.9TB"
        )
    return math.ceil(size)
