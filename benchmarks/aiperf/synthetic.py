"""A learnable synthetic ImageNet in the real on-disk layout: train/<wnid>/<wnid>_<i>.JPEG and
val/<wnid>/ILSVRC2012_val_<n>.JPEG, generated whole into a hidden sibling and renamed into place.

Each class owns a pair of colours striped by a grating of its own orientation and frequency, plus
blobs of a third colour; every image draws the grating's phase, the blobs' places, a brightness and
per-pixel noise. No single pixel tells the class (it is any mix of the pair, plus noise), but the
colours and the stripes do, so a two-layer CNN learns it in a few epochs.
"""

from __future__ import annotations

import colorsys
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
from PIL import Image

from mlhpc.common.errors import ConfigError, DataError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_json
from mlhpc.common.safeio.safe_json import BadJson, load_file

MARKER = ".mlhpc-imagenet.json"
"""Written last into a generated dataset: its parameters, so a rerun with the same ones reuses it."""
FORMAT = "mlhpc synthetic imagenet 1"
JPEG_QUALITY = 90
NOISE = 0.08
"""Standard deviation of the per-pixel noise, on the 0-1 scale."""
BLOBS = 2
"""Colour blobs per image, at random places."""
_WORK_INFIX = ".mlhpc-generating-"
GOLDEN = (5**0.5 - 1) / 2


def _rgb(hue: float, saturation: float, value: float) -> tuple[float, float, float]:
    return colorsys.hsv_to_rgb(hue % 1.0, saturation, value)


def class_names(classes: int, seed: int) -> list[str]:
    """`classes` distinct, sorted ImageNet-like wnids (`n01440764`), the same for the same seed."""
    rng = np.random.default_rng([seed, 0])
    numbers: set[int] = set()
    while len(numbers) < classes:
        numbers.update(int(n) for n in rng.integers(10**6, 10**8, size=classes - len(numbers)))
    return [f"n{n:08d}" for n in sorted(numbers)]


def estimated_bytes(*, classes: int, train_per_class: int, val_per_class: int, resolution: int) -> int:
    """About (rather more than) what `generate_imagenet` writes: noisy JPEGs at quality 90 take
    about a third of a byte a pixel channel, plus headers, directory entries and the marker."""
    per_image = resolution * resolution * 3 * 2 // 5 + 1024
    return classes * (train_per_class + val_per_class) * per_image + 2 * classes * 4096 + 4096


def _check_args(classes: int, train_per_class: int, val_per_class: int, resolution: int, seed: int) -> None:
    for name, value, least in (
        ("classes", classes, 2),
        ("train_per_class", train_per_class, 1),
        ("val_per_class", val_per_class, 1),
        ("resolution", resolution, 8),
        ("seed", seed, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(
                f"{name}={value!r} is not allowed for a synthetic ImageNet; give an integer >= {least}"
            )
    if classes > 10**6:
        raise ConfigError(f"classes={classes} is more than a synthetic ImageNet names; give at most 1000000")


class _ClassLook:
    """What one class's images share: two colours, a grating, a blob colour."""

    def __init__(self, seed: int, label: int) -> None:
        rng = np.random.default_rng([seed, 1, label])
        # Hues a golden-ratio step apart: neighbouring labels' colours differ most.
        hue = (label * GOLDEN + rng.uniform(0, 0.05) + seed * GOLDEN**2) % 1.0
        light, dark = rng.uniform(0.75, 1.0), rng.uniform(0.2, 0.45)
        self.colours = np.array([_rgb(hue, 0.85, light), _rgb(hue + 0.5, 0.6, dark)])
        self.blob = np.array(_rgb(hue + 0.25, 1.0, 1.0))
        self.angle = rng.uniform(0, np.pi)
        self.cycles = rng.uniform(1.5, 4.5)
        """Stripes across the image (scale-free: the same look at any resolution)."""

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """One (size, size, 3) uint8 image of this class."""
        y, x = (np.mgrid[0:size, 0:size] + 0.5) / size
        along = x * np.cos(self.angle) + y * np.sin(self.angle)
        stripe = 0.5 + 0.5 * np.sin(2 * np.pi * self.cycles * along + rng.uniform(0, 2 * np.pi))
        image = stripe[..., None] * self.colours[0] + (1 - stripe[..., None]) * self.colours[1]
        for _ in range(BLOBS):
            cy, cx = rng.uniform(0.15, 0.85, size=2)
            radius = rng.uniform(0.08, 0.16)
            weight = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * radius**2))[..., None]
            image = image * (1 - weight) + self.blob * weight
        image = image * rng.uniform(0.85, 1.15) + rng.normal(0, NOISE, size=image.shape)
        return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


def _write(work: Path, params: dict[str, int]) -> None:
    names = class_names(params["classes"], params["seed"])
    size, seed = params["resolution"], params["seed"]
    val_number = 0
    looks = [_ClassLook(seed, label) for label in range(len(names))]
    mislabeled = params.get("mislabeled_percent", 0) / 100
    for label, wnid in enumerate(names):
        for split, count in (("train", params["train_per_class"]), ("val", params["val_per_class"])):
            folder = work / split / wnid
            folder.mkdir(parents=True)
            rng = np.random.default_rng([seed, 2 if split == "train" else 3, label])
            for i in range(count):
                if split == "train":
                    name = f"{wnid}_{i}.JPEG"
                else:
                    val_number += 1
                    name = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                look = looks[int(rng.integers(len(looks)))] if rng.random() < mislabeled else looks[label]
                Image.fromarray(look.draw(rng, size), "RGB").save(folder / name, "JPEG", quality=JPEG_QUALITY)
    atomic_write_json(work / MARKER, {"format": FORMAT, **params})


def _existing(out_dir: Path, params: dict[str, int]) -> bool:
    """True for a finished dataset of `params` at `out_dir`; False for nothing or an empty folder
    there (generated into); a DataError for anything else, which is never touched."""
    if out_dir.is_symlink() or (os.path.lexists(out_dir) and not out_dir.is_dir()):
        raise DataError(f"{shown(out_dir)} is not a folder; pass a new or empty folder to generate into")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return False
    try:
        found = load_file(out_dir / MARKER, dict, max_bytes=1 << 16)
    except (OSError, BadJson):
        found = None
    if found is None or found.get("format") != FORMAT:
        raise DataError(
            f"{shown(out_dir)} holds files that are not an mlhpc synthetic ImageNet; "
            "pass a new or empty folder, or remove it if it is yours to remove"
        )
    if {k: v for k, v in found.items() if k != "format"} != params:
        theirs = ", ".join(f"{k}={found.get(k)!r}" for k in params)
        raise DataError(
            f"{shown(out_dir)} holds a synthetic ImageNet of other parameters ({theirs}); "
            "remove it or pass another folder"
        )
    return True


def generate_imagenet(
    out_dir: Path,
    *,
    classes: int,
    train_per_class: int,
    val_per_class: int,
    resolution: int,
    seed: int = 0,
    mislabeled_percent: int = 0,
    allow_size: int | None = None,
) -> Path:
    """Write a synthetic ImageNet (RGB JPEGs of resolution x resolution) into `out_dir`, or reuse
    the one there made with the same parameters. Written into a hidden sibling folder and renamed
    into place once complete: a killed generation leaves nothing under `out_dir`. A folder holding
    anything else is refused untouched; so is a dataset that does not fit on the disk, or one over
    4 GiB without `allow_size` (bytes) at least as large. `mislabeled_percent`: that share of the
    images (train and val alike) shows a random class's look under its folder's label, an error no
    model can remove (like ImageNet's), so that top-1 stays below 1 and AIPerf's regulator
    |ln(1 - top-1)| means something."""
    from mlhpc.generation import check_room  # one judge of disk room for every generator

    _check_args(classes, train_per_class, val_per_class, resolution, seed)
    out_dir = Path(out_dir)
    params = {
        "classes": classes,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "resolution": resolution,
        "seed": seed,
        **({"mislabeled_percent": mislabeled_percent} if mislabeled_percent else {}),
    }
    if not isinstance(mislabeled_percent, int) or not 0 <= mislabeled_percent <= 100:
        raise ConfigError(f"mislabeled_percent={mislabeled_percent!r} must be an integer from 0 to 100")
    if _existing(out_dir, params):
        return out_dir
    size = estimated_bytes(
        classes=classes, train_per_class=train_per_class, val_per_class=val_per_class, resolution=resolution
    )
    check_room(size, out_dir, allow_size, "a synthetic ImageNet", "pass a smaller one or another folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.parent / f".{out_dir.name}{_WORK_INFIX}{uuid.uuid4().hex}"
    work.mkdir()
    try:
        _write(work, params)
        os.rename(work, out_dir)  # replaces an empty folder; fails on one filled meanwhile
    except OSError as e:
        raise DataError(
            f"cannot generate a synthetic ImageNet into {shown(out_dir)} ({e.strerror or e}); "
            "check that folder and the space left, then rerun"
        ) from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir
