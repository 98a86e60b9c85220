"""Hostile dataset files (issue 31): a FIFO, device or socket anywhere in a dataset is refused in
one line naming it, never opened (a FIFO would block every reader, under h5py past SIGTERM and
Ctrl-C); hand-damaged HDF5 in a DeepCAM dataset is one line naming the file, never a traceback."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.cosmoflow import data as cosmo
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.benchmarks.deepcam import data as deepcam
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.benchmarks.extreme_weather import data as weather
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.datasets import open_h5, open_sample
from tests.helpers.cli import cli_env
from tests.helpers.processes import no_hang

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


COSMO_SMALL = ("data.num_train_samples=8", "data.num_eval_samples=2")
DEEPCAM_SMALL = ("data.height=32", "data.width=48", "data.num_train_samples=8", "data.num_eval_samples=4")
WEATHER_SMALL = ("data.height=32", "data.width=64", "data.num_train_samples=4", "data.num_eval_samples=2")
# name: (data module, config class, registered benchmark, overrides of its mini config)
KINDS: dict[str, tuple[Any, type, str, tuple[str, ...]]] = {
    "cosmoflow": (cosmo, CosmoFlowConfig, "cosmoflow", COSMO_SMALL),
    "deepcam": (deepcam, DeepCamConfig, "deepcam", DEEPCAM_SMALL),
    "deepcam-numpy": (deepcam, DeepCamConfig, "deepcam", (*DEEPCAM_SMALL, "data.format=numpy")),
    "extreme_weather": (
        weather,
        ExtremeWeatherConfig,
        "extreme_weather",
        (*WEATHER_SMALL, "data.samples_per_file=2"),
    ),
}


def _cfg(name: str, *more: str) -> Any:
    _, cls, bench, overrides = KINDS[name]
    return load_config(cls, registry.get(bench).config_path("mini"), [*overrides, *more])


BENCHMARKS = {name: (module, _cfg(name)) for name, (module, *_) in KINDS.items()}
DEEPCAM = BENCHMARKS["deepcam"][1]
WEATHER = BENCHMARKS["extreme_weather"][1]
# The files each reader opens (a FIFO elsewhere, e.g. a manifest, is not theirs to judge).
READ = {
    "cosmoflow": ("*.npy", "*.lst"),
    "deepcam": ("data-*.h5", "stats.h5"),
    "deepcam-numpy": ("data-*.npy", "label-*.npy", "stats.h5"),
    "extreme_weather": ("climo_*.h5",),  # its stats.h5 is read when the loaders are built
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for name, (module, cfg) in BENCHMARKS.items():
        made[name] = module.generate(cfg, tmp_path_factory.mktemp(name) / "data", seed=3)
    return made


@contextmanager
def fresh_copy(src: Path) -> Iterator[Path]:
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlhpc-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        yield Path(shutil.copytree(src, scratch / "data"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _validates(name: str) -> Callable[[Path], None]:
    module, cfg = BENCHMARKS[name]
    return lambda root: module.validate_dataset(cfg, root)


def _read_files(root: Path, name: str) -> list[Path]:
    return sorted({p for pattern in READ[name] for p in root.rglob(pattern) if not p.name.startswith(".")})


def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")  # a link to a device: judged by what it leads to
    else:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))


# ---------------------------------------------------------------- special files, listed and opened
@SETTINGS
@given(
    name=st.sampled_from(sorted(BENCHMARKS)),
    kind=st.sampled_from(["fifo", "device", "socket"]),
    pick=st.randoms(use_true_random=False),
)
def test_a_special_file_anywhere_in_a_dataset_is_one_line_naming_it(
    datasets: dict[str, Path], name: str, kind: str, pick: random.Random
) -> None:
    with fresh_copy(datasets[name]) as root:
        victim = pick.choice(_read_files(root, name))
        _replace(victim, kind)
        with no_hang(), pytest.raises(DataError) as refused:
            _validates(name)(root)
    message = str(refused.value)
    assert str(victim) in message and "not a regular file" in message and "\n" not in message, message
    wanted = {"fifo": "FIFO", "device": "character device", "socket": "socket"}[kind]
    assert wanted in message


@pytest.mark.parametrize("name", ["cosmoflow", "deepcam", "deepcam-numpy"])
def test_a_sample_turned_fifo_after_listing_is_refused_at_open(datasets: dict[str, Path], name: str) -> None:
    """The listing passed; the name is a FIFO by the time a loader opens it."""
    cfg = BENCHMARKS[name][1]
    with fresh_copy(datasets[name]) as root, no_hang():
        if name == "cosmoflow":
            files = cosmo.CosmoFlowFiles(root / "train", apply_log=True)
            victim = files.pairs[2][0]
        else:
            stats = deepcam.read_stats(root, cfg.data.num_channels)
            files = deepcam.DeepCamFiles(root / "train", file_format=cfg.data.format, stats=stats)
            victim = files.pairs[2][0]
        _replace(victim, "fifo")
        with pytest.raises(DataError, match="FIFO"):
            files[2]
        with pytest.raises(DataError, match="FIFO"):
            open_sample(victim)
        with pytest.raises(DataError, match="FIFO"):
            open_h5(victim)


def test_a_fifo_in_an_extreme_weather_year_file_after_listing(datasets: dict[str, Path]) -> None:
    with fresh_copy(datasets["extreme_weather"]) as root, no_hang():
        mean, std = weather.load_stats(root)
        files = weather.ExtremeWeatherFiles(root / "train", WEATHER, mean, std)
        _replace(files.files[0], "fifo")
        with pytest.raises(DataError, match="FIFO"):
            files[0]
        _replace(root / "stats.h5", "fifo")
        with pytest.raises(DataError, match=r"stats\.h5 is a FIFO"):
            weather.load_stats(root)


# ---------------------------------------------------------------- hand-damaged DeepCAM HDF5
def _rewrite(path: Path, build: Callable[[h5py.File], None]) -> None:
    path.unlink()
    with h5py.File(path, "w") as handle:
        build(handle)


SHAPE = (32, 48, 16)
DAMAGE: dict[str, Callable[[h5py.File], None]] = {
    "empty file": lambda h: None,
    "no labels": lambda h: h.create_dataset("climate/data", data=np.zeros(SHAPE, "f4")),
    "data is a group": lambda h: (h.create_group("climate/data"), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "soft link to nowhere": lambda h: (h.__setitem__("climate/data", h5py.SoftLink("/nowhere")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "scalar data": lambda h: (h.create_dataset("climate/data", data=1.0), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "string data": lambda h: (h.create_dataset("climate/data", data=np.full(SHAPE, b"x", "S1")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "compound labels": lambda h: (h.create_dataset("climate/data", data=np.zeros(SHAPE, "f4")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], [("a", "i4"), ("b", "f4")]))),
    "wrong shape": lambda h: (h.create_dataset("climate/data", data=np.zeros((32, 48, 3), "f4")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "integer data": lambda h: (h.create_dataset("climate/data", data=np.zeros(SHAPE, "i4")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "empty dataspace": lambda h: (h.create_dataset("climate/data", data=h5py.Empty("f4")), h.create_dataset("climate/labels_0", data=np.zeros(SHAPE[:2], "i4"))),
    "class id 9": lambda h: (h.create_dataset("climate/data", data=np.zeros(SHAPE, "f4")), h.create_dataset("climate/labels_0", data=np.full(SHAPE[:2], 9, "i4"))),
    "NaN labels": lambda h: (h.create_dataset("climate/data", data=np.zeros(SHAPE, "f4")), h.create_dataset("climate/labels_0", data=np.full(SHAPE[:2], np.nan, "f4"))),
}  # fmt: skip
STATS_DAMAGE: dict[str, Callable[[h5py.File], None]] = {
    "no maxval": lambda h: h.create_dataset("climate/minval", data=np.zeros(16)),
    "maxval a group": lambda h: (h.create_dataset("climate/minval", data=np.zeros(16)), h.create_group("climate/maxval")),
    "string range": lambda h: (h.create_dataset("climate/minval", data=np.full(16, b"a")), h.create_dataset("climate/maxval", data=np.full(16, b"b"))),
    "infinite range": lambda h: (h.create_dataset("climate/minval", data=np.full(16, -np.inf)), h.create_dataset("climate/maxval", data=np.ones(16))),
    "8 channels": lambda h: (h.create_dataset("climate/minval", data=np.zeros(8)), h.create_dataset("climate/maxval", data=np.ones(8))),
}  # fmt: skip


def _one_line(validate: Callable[[Path], None], root: Path, named: Path) -> str:
    with no_hang(), pytest.raises(DataError) as refused:
        validate(root)
    message = str(refused.value)
    assert str(named) in message and "\n" not in message, message
    assert any(fix in message for fix in ("regenerate", "restage", "set data.", "use the stats")), message
    return message


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_deepcam_sample_is_one_line(datasets: dict[str, Path], damage: str) -> None:
    with fresh_copy(datasets["deepcam"]) as root:
        victim = sorted((root / "validation").glob("data-*.h5"))[0]
        _rewrite(victim, DAMAGE[damage])
        _one_line(_validates("deepcam"), root, victim)


@pytest.mark.parametrize("damage", sorted(STATS_DAMAGE))
def test_a_damaged_deepcam_stats_file_is_one_line(datasets: dict[str, Path], damage: str) -> None:
    with fresh_copy(datasets["deepcam"]) as root:
        _rewrite(root / "stats.h5", STATS_DAMAGE[damage])
        _one_line(_validates("deepcam"), root, root / "stats.h5")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.sampled_from(["sample", "stats"]),
    cut=st.none() | st.floats(min_value=0.0, max_value=0.999),
    flips=st.lists(st.tuples(st.floats(0.0, 0.999), st.integers(0, 255)), max_size=8),
    header_only=st.booleans(),
)
def test_random_damage_to_deepcam_hdf5_is_one_line_or_harmless(
    datasets: dict[str, Path],
    which: str,
    cut: float | None,
    flips: list[tuple[float, int]],
    header_only: bool,
) -> None:
    """Truncation and flipped bytes (mostly in the first 4 KiB, where HDF5 keeps its metadata):
    the check passes (a flip in the numbers themselves is no structure to find) or refuses in
    one line naming the file; never another exception, never a hang."""
    with fresh_copy(datasets["deepcam"]) as root:
        victim = root / "stats.h5" if which == "stats" else sorted((root / "train").glob("data-*.h5"))[1]
        damaged = bytearray(victim.read_bytes())
        span = min(len(damaged), 4096) if header_only else len(damaged)
        for where, value in flips:
            damaged[int(where * span)] = value
        if cut is not None:
            damaged = damaged[: int(cut * len(damaged))]
        victim.write_bytes(bytes(damaged))
        try:
            with no_hang():
                deepcam.validate_dataset(DEEPCAM, root)
        except DataError as e:
            assert str(victim) in str(e) and "\n" not in str(e), str(e)
        else:
            assert cut is None, "a truncated file passed the check"


# ---------------------------------------------------------------- the command, end to end
@pytest.mark.parametrize("name", ["cosmoflow", "deepcam"])
def test_mlhpc_run_with_a_fifo_in_data_is_one_line_and_prompt(
    datasets: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """The issue's case: before, the run blocked (under h5py past SIGTERM and Ctrl-C)."""
    root = Path(shutil.copytree(datasets[name], tmp_path / "data"))
    victim = _read_files(root, name)[3]
    _replace(victim, "fifo")
    size = KINDS[name][3]
    args = [
        "run",
        name,
        "--config",
        "mini",
        "--seeds",
        "1",
        "--data",
        str(root),
        "--out",
        str(tmp_path / "out"),
    ]
    started = time.monotonic()
    proc = subprocess.run(
        # a batch the 8 samples hold: a batch an epoch cannot fill is refused before any read
        [sys.executable, "-m", "mlhpc", *args, "--system", "ci", "--no-check", *size, "loop.global_batch_size=4"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local")),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mlhpc: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert str(victim) in proc.stderr and "FIFO" in proc.stderr
    assert time.monotonic() - started < 60


# ---------------------------------------------------------------- errors inside DataLoader workers
@pytest.mark.parametrize("name", ["cosmoflow", "deepcam"])
def test_a_sample_damaged_after_validation_is_one_line_from_a_worker(
    datasets: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """Torch re-raises a worker's error as "Caught DataError in DataLoader worker process 0." and
    its traceback; the line shown must still be the worker's own, naming the file."""
    from mlhpc.common.cluster.distributed import init_distributed

    module = BENCHMARKS[name][0]
    cfg = _cfg(name, "data.num_workers=1", "loop.global_batch_size=2")
    root = Path(shutil.copytree(datasets[name], tmp_path / "data"))
    bundle = module.build_torch_data(cfg, root, init_distributed("auto", "cpu"), seed=1)
    for path in _read_files(root, name):
        if path.parent.name == "validation" and path.suffix in (".npy", ".h5") and "label" not in path.name:
            path.write_bytes(path.read_bytes()[:100])  # cut short after the check
    with no_hang(), pytest.raises(DataError) as refused:
        list(bundle.validation)
    message = str(refused.value)
    assert "\n" not in message and "Caught" not in message, message
    assert str(root / "validation") in message and "regenerate or restage" in message, message
