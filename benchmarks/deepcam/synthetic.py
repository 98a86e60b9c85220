"""Learnable synthetic DeepCAM samples in the real file layout, with their stats.h5.

Each sample holds 1-3 tropical cyclones (round vortices: a pressure low, rotating winds, moisture
and rain) and one atmospheric river (a long curved filament of moisture and wind), over smooth
weather noise and a latitude gradient. Every sample has both classes, as a real global CAM5
snapshot nearly always does: the reference's IoU scores a class absent from a sample as 1 while the
model predicts none of it and as 0 after a single stray pixel, so absent classes made the metric
of the mini a cliff rather than a measure of the segmentation (seeds plateaued at 0.65-0.8). The class map follows from the clean structures: a
pixel is a cyclone where the vortex profile exceeds one half, else a river where the filament
profile does, so the model must combine channels (moisture alone cannot tell them apart).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import h5py
import numpy as np
import torch
import torch.nn.functional as F

# The 16 CAM5 variables of the real dataset, in its channel order, with a typical offset and
# scale so that the per-channel min-max normalisation does real work.
CHANNELS = (
    ("PRECT", 0.0, 1e-4), ("PS", 98000.0, 1500.0), ("PSL", 101000.0, 1500.0), ("QREFHT", 0.008, 0.006),
    ("T200", 218.0, 6.0), ("T500", 255.0, 10.0), ("TMQ", 20.0, 15.0), ("TREFHT", 283.0, 15.0),
    ("TS", 285.0, 16.0), ("U850", 2.0, 10.0), ("UBOT", 1.0, 8.0), ("V850", 0.0, 10.0),
    ("VBOT", 0.0, 8.0), ("Z1000", 110.0, 90.0), ("Z200", 11800.0, 300.0), ("ZBOT", 60.0, 20.0),
)  # fmt: skip
# How strongly the cyclone profile p, the river profile q and the rotating wind (u, v) enter
# each channel's anomaly: rows follow CHANNELS, columns (p, q, u, v).
LOADINGS = np.array(
    [
        [0.9, 0.6, 0, 0], [-1.0, 0, 0, 0], [-1.2, 0, 0, 0], [0.5, 0.7, 0, 0],
        [0.4, 0, 0, 0], [0.5, 0.2, 0, 0], [0.8, 1.2, 0, 0], [0, 0.2, 0, 0],
        [0, 0, 0, 0], [0, 0.5, 1.0, 0], [0, 0.3, 0.8, 0], [0, 0.5, 0, 1.0],
        [0, 0.3, 0, 0.8], [-1.0, 0, 0, 0], [-0.3, 0, 0, 0], [0, 0, 0, 0],
    ],
    dtype=np.float32,
)  # fmt: skip
NOISE = 0.05
"""Amplitude of the smooth weather noise on each channel's unit-scale anomaly. Smooth over about an
eighth of the height, the noise moves a structure's half-profile contour (the labels' edge) by
about the noise over the profile's slope there (0.69 / radius per pixel): at 0.15 that was
of the order of a pixel even for an ideal model, a class IoU ceiling not far above the 0.82
target; at 0.05 a third of that."""
CYCLONE_RADIUS = (0.11, 0.18)
"""Range of a cyclone's radius (where its profile crosses one half), as a fraction of the height."""
RIVER_HALF_WIDTH = (0.07, 0.11)
"""Range of a river's half width (where its profile crosses one half), as a fraction of the height."""
# Sized so that the IoU target measures learning, not the last pixel: at radii of 0.07-0.12 and
# half widths of 0.04-0.07 of the height (7-12 and 4-7 pixels in the mini), a boundary one pixel
# off cost a class 0.19-0.22 of IoU, so reaching mean IoU 0.82 took sub-pixel edges, and seeds
# whose small network plateaued at 0.77-0.84 reached it late or never. At these sizes a pixel off
# costs 0.13-0.15 (the mean over samples of a class's IoU after a one-pixel erosion).
STRUCTURE_THRESHOLD = 0.5
HALF = np.log(2.0)  # profiles exp(-HALF (d / radius)^2) cross one half at d = radius
FIELD_DTYPE = np.dtype("<f4")
LABEL_DTYPE = np.dtype("<i4")
"""The dtypes of the fields and the class map as written (the reference's float32 fields)."""


def synthesize_sample(
    rng: np.random.Generator, height: int, width: int, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """One sample: (H, W, C) float32 fields and (H, W) int32 class map."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cyclone = np.zeros((height, width), np.float32)
    wind_u = np.zeros_like(cyclone)
    wind_v = np.zeros_like(cyclone)
    for _ in range(1 + rng.choice(3, p=(0.45, 0.35, 0.2))):
        radius = rng.uniform(*CYCLONE_RADIUS) * height
        cy, cx = rng.uniform(0.15, 0.85) * height, rng.uniform(0.05, 0.95) * width
        dy, dx = y - cy, x - cx
        profile = np.exp(-HALF * (dy**2 + dx**2) / radius**2)
        spin = rng.choice((-1.0, 1.0))  # either hemisphere
        wind_u += spin * -dy / radius * profile
        wind_v += spin * dx / radius * profile
        cyclone = np.maximum(cyclone, profile)
    half_width = rng.uniform(*RIVER_HALF_WIDTH) * height
    y0, slope = rng.uniform(0.2, 0.8) * height, rng.uniform(-0.3, 0.3) * height / width
    amp, wavelength, phase = (
        rng.uniform(0.03, 0.12) * height,
        rng.uniform(0.6, 1.5) * width,
        rng.uniform(0, 2 * np.pi),
    )
    x0 = rng.uniform(0.0, 0.4) * width
    x1 = x0 + rng.uniform(0.4, 0.6) * width
    centre = y0 + slope * (x - x0) + amp * np.sin(2 * np.pi * x / wavelength + phase)
    along = np.clip(np.minimum(x - x0, x1 - x) / half_width, None, 0.0)  # 0 inside [x0, x1]
    river = np.exp(-HALF * (((y - centre) / half_width) ** 2 + along**2))
    label = np.zeros((height, width), LABEL_DTYPE)
    label[river > STRUCTURE_THRESHOLD] = 2
    label[cyclone > STRUCTURE_THRESHOLD] = 1
    latitude = np.cos(np.pi * (y / (height - 1) - 0.5))  # warm, moist tropics in the middle rows
    noise = _smooth_noise(rng, height, width, channels)
    structures = np.stack([cyclone, river, wind_u, wind_v], axis=-1)
    loadings = LOADINGS[np.arange(channels) % len(LOADINGS)]
    anomaly = structures @ loadings.T + NOISE * noise + 0.5 * latitude[..., None]
    offsets = np.array([CHANNELS[c % len(CHANNELS)][1] for c in range(channels)], np.float32)
    scales = np.array([CHANNELS[c % len(CHANNELS)][2] for c in range(channels)], np.float32)
    return (offsets + scales * anomaly).astype(FIELD_DTYPE), label


def _smooth_noise(rng: np.random.Generator, height: int, width: int, channels: int) -> np.ndarray:
    """Unit-variance noise correlated over about an eighth of the height, (H, W, C)."""
    coarse = torch.from_numpy(rng.standard_normal((1, channels, max(2, height // 12), max(2, width // 12))))
    fine = F.interpolate(coarse.float(), size=(height, width), mode="bicubic", align_corners=False)
    fine_hwc = fine[0].permute(1, 2, 0).numpy()
    return (fine_hwc - fine_hwc.mean()) / (fine_hwc.std() + 1e-6)


def write_dataset(
    root: Path,
    *,
    height: int,
    width: int,
    channels: int,
    counts: dict[str, int],
    file_format: Literal["hdf5", "numpy"],
    seed: int,
) -> Path:
    """Write every split and a stats.h5 whose min/max cover the training samples."""
    minval = np.full(channels, np.inf)
    maxval = np.full(channels, -np.inf)
    for offset, (split, count) in enumerate(counts.items()):
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, offset])
        for i in range(count):
            data, label = synthesize_sample(rng, height, width, channels)
            name = f"synth-{split}-{i:06d}"
            if file_format == "hdf5":
                _write_hdf5(folder / f"data-{name}.h5", {"climate/data": data, "climate/labels_0": label})
            else:
                _write_npy(folder / f"data-{name}.npy", data)
                _write_npy(folder / f"label-{name}.npy", label)
            if split == "train":
                minval = np.minimum(minval, data.min(axis=(0, 1)))
                maxval = np.maximum(maxval, data.max(axis=(0, 1)))
    _write_hdf5(
        root / "stats.h5",
        {"climate/minval": minval.astype(np.float32), "climate/maxval": maxval.astype(np.float32)},
    )
    return root


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write_hdf5(path: Path, datasets: dict[str, np.ndarray]) -> None:
    tmp = _tmp(path)
    with h5py.File(tmp, "w") as handle:
        for key, value in datasets.items():
            handle.create_dataset(key, data=value)
    tmp.replace(path)


def _write_npy(path: Path, array: np.ndarray) -> None:
    tmp = _tmp(path)
    with open(tmp, "wb") as handle:
        np.save(handle, array)
    tmp.replace(path)
