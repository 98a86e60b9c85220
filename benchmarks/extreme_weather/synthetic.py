"""Learnable synthetic CAM5-like snapshots: storms as pressure minima with vortices, rivers as moist filaments.

Each event is drawn in the channels that define it in the real data, and its box follows from its
drawn extent, so a detector that learns the signatures really finds the boxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHANNELS = (
    "PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT",
    "TS", "U850", "UBOT", "V850", "VBOT", "Z100", "Z200", "ZBOT",
)  # fmt: skip
"""The published order of the `images` channel axis (extremeweatherdataset.github.io)."""
C = {name: i for i, name in enumerate(CHANNELS)}
PAD = -1
"""Fill value of unused `boxes` rows in the published files."""
# How far a storm's box reaches, in Gaussian radii: the vortex winds peak at one radius.
BOX_RADII = 2.5


@dataclass(frozen=True)
class StormKind:
    """One storm class: where it lives and how strong its signature is."""

    lat_range: tuple[float, float]
    radius_frac: tuple[float, float]
    """Gaussian radius as a fraction of the grid height."""
    stretch_x: float
    """East-west over north-south extent."""
    pressure_pa: float
    wind_ms: float
    warm_core_k: float
    moisture: float
    """Added TMQ (kg/m^2); QREFHT and PRECT follow it."""


STORMS = {
    0: StormKind((5, 25), (0.030, 0.040), 1.0, -900.0, 14.0, 1.0, 12.0),  # tropical depression
    1: StormKind((10, 30), (0.040, 0.055), 1.0, -4500.0, 45.0, 7.0, 30.0),  # tropical cyclone
    2: StormKind((35, 65), (0.055, 0.075), 1.6, -2500.0, 25.0, -5.0, 8.0),  # extratropical cyclone
}
RIVER = 3


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], corr: float) -> np.ndarray:
    """Unit-variance Gaussian random field with correlation length `corr` pixels."""
    noise = rng.standard_normal(shape)
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.rfftfreq(shape[1])[None, :]
    field = np.fft.irfft2(np.fft.rfft2(noise) * np.exp(-2 * (np.pi * corr) ** 2 * (kx**2 + ky**2)), s=shape)
    return field / (field.std() + 1e-12)


def background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """(16, H, W) float64 large-scale state: latitude gradients plus smooth weather noise."""
    lat = np.linspace(90, -90, height)[:, None] * np.ones((1, width))
    coslat = np.cos(np.deg2rad(lat))
    f = np.empty((len(CHANNELS), height, width))
    noise = lambda: _smooth_noise(rng, (height, width), corr=height / 12)  # noqa: E731
    f[C["TS"]] = 240 + 60 * coslat + 2 * noise()
    f[C["TREFHT"]] = f[C["TS"]] - 2 + 0.5 * noise()
    f[C["T500"]] = 235 + 30 * coslat + 1.5 * noise()
    f[C["T200"]] = 215 + 5 * coslat + 1.0 * noise()
    f[C["PS"]] = 98500 + 300 * noise()
    f[C["PSL"]] = 101300 + 300 * noise()
    f[C["TMQ"]] = 5 + 40 * coslat**4 + 3 * noise()
    f[C["QREFHT"]] = 0.002 + 0.016 * coslat**4 + 0.001 * noise()
    f[C["PRECT"]] = 1e-8 * np.exp(1.0 * noise())
    westerlies = 12 * np.sin(np.deg2rad(2 * np.abs(lat))) ** 2 * np.where(np.abs(lat) > 30, 1.0, -0.4)
    f[C["U850"]] = westerlies + 3 * noise()
    f[C["UBOT"]] = 0.6 * f[C["U850"]] + noise()
    f[C["V850"]] = 3 * noise()
    f[C["VBOT"]] = 0.6 * f[C["V850"]] + noise()
    f[C["Z100"]] = 16000 + 400 * coslat + 30 * noise()
    f[C["Z200"]] = 11500 + 500 * coslat + 30 * noise()
    f[C["ZBOT"]] = 60 + 2 * noise()
    return f


def _row_of_lat(lat: float, height: int) -> float:
    return (90 - lat) / 180 * (height - 1)


def add_storm(f: np.ndarray, rng: np.random.Generator, kind: StormKind) -> tuple[float, float, float, float]:
    """Draw one storm into `f`; returns its box (ymin, xmin, ymax, xmax) before clipping."""
    _, height, width = f.shape
    lat = rng.uniform(*kind.lat_range) * rng.choice([-1, 1])
    cy = _row_of_lat(lat, height)
    cx = rng.uniform(0.08, 0.92) * (width - 1)
    ry = rng.uniform(*kind.radius_frac) * height
    rx = ry * kind.stretch_x
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    dy, dx = (yy - cy) / ry, (xx - cx) / rx
    d2 = dx**2 + dy**2
    core = np.exp(-0.5 * d2)
    for name in ("PS", "PSL"):
        f[C[name]] += kind.pressure_pa * core
    f[C["ZBOT"]] += kind.pressure_pa / 120 * core  # 1 hPa is about 8 m of height near the ground
    f[C["Z200"]] += kind.warm_core_k * 8 * core
    f[C["T500"]] += kind.warm_core_k * core
    f[C["T200"]] += 0.6 * kind.warm_core_k * core
    f[C["TMQ"]] += kind.moisture * core
    f[C["QREFHT"]] += kind.moisture * 4e-4 * core
    f[C["PRECT"]] += kind.moisture * 3e-8 * core**2
    # Cyclonic tangential wind, strongest one radius out; it turns the other way south of the equator.
    speed = kind.wind_ms * np.sqrt(d2) * np.exp(0.5 * (1 - d2))
    radius = np.sqrt(d2) + 1e-6
    turn = 1.0 if lat >= 0 else -1.0
    u, v = -turn * speed * dy / radius, turn * speed * dx / radius
    for level, scale in (("850", 1.0), ("BOT", 0.75)):
        f[C[f"U{level}"]] += scale * u
        f[C[f"V{level}"]] += scale * v
    f[C["TS"]] += 0.3 * kind.warm_core_k * core
    return (cy - BOX_RADII * ry, cx - BOX_RADII * rx, cy + BOX_RADII * ry, cx + BOX_RADII * rx)


def add_river(f: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float, float]:
    """Draw one atmospheric river: a long, narrow, moist, windy band from the subtropics poleward."""
    _, height, width = f.shape
    north = rng.choice([-1, 1])
    lat0 = rng.uniform(15, 25) * north
    y0 = _row_of_lat(lat0, height)
    x0 = rng.uniform(0.05, 0.6) * (width - 1)
    length = rng.uniform(0.30, 0.45) * width
    angle = np.deg2rad(rng.uniform(20, 45))  # eastward and poleward
    ey, ex = -north * np.sin(angle), np.cos(angle)
    half_width = rng.uniform(0.020, 0.030) * height
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    along = (yy - y0) * ey + (xx - x0) * ex
    across = -(yy - y0) * ex + (xx - x0) * ey
    inside = np.clip(along / length, 0, 1)
    taper = np.exp(-0.5 * ((along - inside * length) / half_width) ** 2)
    band = np.exp(-0.5 * (across / half_width) ** 2) * taper
    f[C["TMQ"]] += 30 * band
    f[C["QREFHT"]] += 0.008 * band
    f[C["PRECT"]] += 4e-8 * band
    f[C["U850"]] += 20 * ex * band
    f[C["V850"]] += 20 * ey * band
    f[C["UBOT"]] += 12 * ex * band
    f[C["VBOT"]] += 12 * ey * band
    ends_y = np.array([y0, y0 + ey * length])
    ends_x = np.array([x0, x0 + ex * length])
    pad = BOX_RADII * half_width
    return (ends_y.min() - pad, ends_x.min() - pad, ends_y.max() + pad, ends_x.max() + pad)


def _overlaps(box: tuple[float, ...], others: list[tuple[float, ...]]) -> bool:
    return any(
        box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3]  # any shared area
        for o in others
    )


def snapshot(
    rng: np.random.Generator, height: int, width: int, max_boxes: int, max_events: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    """One (16, H, W) float32 image and its (max_boxes, 5) int32 rows [ymin, xmin, ymax, xmax, class]."""
    f = background(rng, height, width)
    boxes: list[tuple[float, ...]] = []
    classes: list[int] = []
    wanted = int(rng.integers(1, min(max_events, max_boxes) + 1))
    for _ in range(wanted * 10):  # retries: events do not overlap
        if len(boxes) == wanted:
            break
        cls = int(rng.integers(0, 4))
        trial = np.zeros_like(f)
        box = add_river(trial, rng) if cls == RIVER else add_storm(trial, rng, STORMS[cls])
        clipped = (max(box[0], 0), max(box[1], 0), min(box[2], height - 1), min(box[3], width - 1))
        if clipped[2] - clipped[0] < 4 or clipped[3] - clipped[1] < 4 or _overlaps(clipped, boxes):
            continue
        f += trial
        boxes.append(clipped)
        classes.append(cls)
    rows = np.full((max_boxes, 5), PAD, dtype=np.int32)
    for i, (box, cls) in enumerate(zip(boxes, classes, strict=True)):
        rows[i, :4] = np.round(box).astype(np.int32)
        rows[i, 4] = cls
    return f.astype(np.float32), rows
