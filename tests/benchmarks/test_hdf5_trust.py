"""HDF5 that reads outside itself (issue 39): a dataset with external storage (on a FIFO: a read
that blocks past SIGTERM and Ctrl-C; on any readable file: trained on), a virtual dataset, an
external link or a soft link through one is refused in one line naming the file, by every reader,
by `mlhpc manifest` and by `mlhpc run`, before any byte outside the file is read."""

from __future__ import annotations

import ast
import os
import shutil
import string
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.deepcam import data as deepcam
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.benchmarks.extreme_weather import data as weather
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.datasets import MAX_H5_LINKS, open_h5
from mlhpc.staging import build_manifest
from mlhpc.staging.manifest import MANIFEST_NAME
from tests.helpers.cli import mlhpc
from tests.helpers.processes import no_hang

REPO = Path(__file__).resolve().parents[2]
# a batch the 4 samples hold: mlhpc run refuses a batch an epoch cannot fill before any read
DEEPCAM_SMALL = (
    "data.height=32",
    "data.width=48",
    "data.num_train_samples=4",
    "data.num_eval_samples=2",
    "loop.global_batch_size=4",
)
WEATHER_SMALL = (
    "data.height=32",
    "data.width=64",
    "data.num_train_samples=4",
    "data.num_eval_samples=2",
    "data.samples_per_file=2",
    "loop.global_batch_size=4",
)
DEEPCAM = load_config(DeepCamConfig, registry.get("deepcam").config_path("mini"), list(DEEPCAM_SMALL))
WEATHER = load_config(
    ExtremeWeatherConfig, registry.get("extreme_weather").config_path("mini"), list(WEATHER_SMALL)
)
FIX = "rewrite it with all its data inside the file"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "deepcam": deepcam.generate(DEEPCAM, tmp_path_factory.mktemp("deepcam") / "data", seed=3),
        "extreme_weather": weather.generate(WEATHER, tmp_path_factory.mktemp("weather") / "data", seed=3),
    }


# ---------------------------------------------------------------- the plants
def _source(outside: Path, value: np.ndarray) -> Path:
    """An HDF5 file outside the dataset holding `value` as /x: what a link or VDS would read."""
    src = outside / f"source-{time.monotonic_ns()}.h5"
    with h5py.File(src, "w") as h5:
        h5["x"] = value
    return src


def _unlimited_vds_on_fifo(h5: h5py.File, key: str, value: np.ndarray, fifo: Path) -> None:
    """The nastiest: asking an unlimited virtual dataset its extent opens its sources."""
    from h5py import h5d, h5p, h5s, h5t

    unlimited = (h5s.UNLIMITED,) * value.ndim
    virtual = h5s.create_simple(value.shape, unlimited)
    virtual.select_all()
    source = h5s.create_simple(value.shape, unlimited)
    source.select_all()
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_virtual(virtual, str(fifo).encode(), b"x", source)
    group = h5.require_group(key.rpartition("/")[0] or "/")
    h5d.create(group.id, key.rpartition("/")[2].encode(), h5t.py_create(value.dtype), virtual, dcpl=dcpl)


def plant(path: Path, key: str, how: str, outside: Path) -> None:
    """Replace dataset `key` of the HDF5 file `path` by one that reads from `outside`, with the
    same shape, type and values where it can be read (a reader without the check trains on it)."""
    fifo = outside / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    with h5py.File(path, "a") as h5:
        value = h5[key][...]
        del h5[key]
        if how == "storage-on-fifo":
            h5.create_dataset(key, value.shape, value.dtype, external=[(str(fifo), 0, value.nbytes)])
        elif how == "storage-on-file":  # the /etc/shadow case: raw bytes of any readable file
            raw = outside / f"raw-{time.monotonic_ns()}"
            raw.write_bytes(value.tobytes())
            h5.create_dataset(key, value.shape, value.dtype, external=[(str(raw), 0, value.nbytes)])
        elif how == "virtual":
            layout = h5py.VirtualLayout(value.shape, value.dtype)
            layout[...] = h5py.VirtualSource(str(_source(outside, value)), "x", value.shape)
            h5.create_virtual_dataset(key, layout)
        elif how == "virtual-unlimited-on-fifo":
            _unlimited_vds_on_fifo(h5, key, value, fifo)
        elif how == "external-link":
            h5[key] = h5py.ExternalLink(str(_source(outside, value)), "/x")
        elif how == "soft-link-through-external":
            h5["elsewhere"] = h5py.ExternalLink(str(_source(outside, value)), "/x")
            h5[key] = h5py.SoftLink("/elsewhere")
        elif how == "soft-link-inside":  # the control: a soft link that stays in the file is fine
            h5["kept"] = value
            h5[key] = h5py.SoftLink("/kept")
        else:
            raise AssertionError(how)


PLANTS = (
    "storage-on-fifo",
    "storage-on-file",
    "virtual",
    "virtual-unlimited-on-fifo",
    "external-link",
    "soft-link-through-external",
)
# target: (benchmark, the planted file under the dataset root, its dataset, the reader)
TARGETS: dict[str, tuple[str, Callable[[Path], Path], str, Callable[[Path], Any]]] = {
    "deepcam-sample": (
        "deepcam",
        lambda root: sorted((root / "train").glob("data-*.h5"))[1],
        deepcam.DATA_KEY,
        lambda root: deepcam.validate_dataset(DEEPCAM, root),
    ),
    "deepcam-stats": (
        "deepcam",
        lambda root: root / deepcam.STATS_FILE,
        deepcam.MAX_KEY,
        lambda root: deepcam.read_stats(root, DEEPCAM.data.num_channels),
    ),
    "weather-year": (
        "extreme_weather",
        lambda root: sorted((root / "validation").glob("climo_*.h5"))[0],
        weather.IMAGES,
        lambda root: weather.validate_dataset(WEATHER, root),
    ),
    "weather-stats": (
        "extreme_weather",
        lambda root: root / weather.STATS_FILE,
        "mean",
        weather.load_stats,
    ),
}


def planted(datasets: dict[str, Path], tmp_path: Path, target: str, how: str) -> tuple[Path, Path]:
    """A fresh copy of the target's dataset with `how` planted; (root, the planted file)."""
    bench, victim_of, key, _ = TARGETS[target]
    root = Path(shutil.copytree(datasets[bench], tmp_path / "data"))
    (outside := tmp_path / "outside").mkdir()
    victim = victim_of(root)
    plant(victim, key, how, outside)
    return root, victim


def one_line_naming(error: BaseException, victim: Path) -> str:
    message = str(error)
    assert "\n" not in message and str(victim) in message and FIX in message, message
    return message


# ---------------------------------------------------------------- every reader
@pytest.mark.parametrize("how", PLANTS)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_reader_refuses_hdf5_reading_outside_itself(
    datasets: dict[str, Path], tmp_path: Path, target: str, how: str
) -> None:
    root, victim = planted(datasets, tmp_path, target, how)
    started = time.monotonic()
    with no_hang(), pytest.raises(DataError) as refused:
        TARGETS[target][3](root)
    message = one_line_naming(refused.value, victim)
    named = "elsewhere" if how == "soft-link-through-external" else TARGETS[target][2]
    assert named in message, message
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_soft_link_inside_the_file_still_reads(
    datasets: dict[str, Path], tmp_path: Path, target: str
) -> None:
    """The control: the check refuses what leaves the file, not links as such."""
    root, _ = planted(datasets, tmp_path, target, "soft-link-inside")
    TARGETS[target][3](root)


def test_a_sample_planted_after_validation_is_refused_at_read(
    datasets: dict[str, Path], tmp_path: Path
) -> None:
    """The training reader (a DataLoader worker, DALI's workers) opens every sample through the
    same check: a swap after `validate_dataset` blocks nothing either."""
    root = Path(shutil.copytree(datasets["deepcam"], tmp_path / "data"))
    files = deepcam.DeepCamFiles(root / "train", file_format="hdf5", stats=deepcam.read_stats(root, 16))
    files.read(0)
    (outside := tmp_path / "outside").mkdir()
    plant(files.pairs[0][0], deepcam.LABEL_KEY, "storage-on-fifo", outside)
    with no_hang(), pytest.raises(DataError) as refused:
        files.read(0)
    one_line_naming(refused.value, files.pairs[0][0])


def test_more_links_than_any_sample_holds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.h5"
    with h5py.File(path, "w") as h5:
        for i in range(MAX_H5_LINKS + 1):
            h5.create_group(f"g{i}")
    with pytest.raises(DataError, match="more than"):
        open_h5(path)
    with h5py.File(path, "a") as h5:
        del h5["g0"]
    open_h5(path).close()  # the bound itself is allowed


# ---------------------------------------------------------------- anywhere in the file (hypothesis)
NAMES = st.text(string.ascii_letters + string.digits + "_-é ", min_size=1, max_size=6).filter(
    lambda n: n.strip() == n and n not in (".", "..")
)
PLANTED_ANYWHERE = ("storage-on-file", "virtual", "external-link", "soft-link-through-external", None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    groups=st.lists(st.lists(NAMES, min_size=1, max_size=3), min_size=1, max_size=4),
    where=st.integers(0, 3),
    name=NAMES,
    how=st.sampled_from(PLANTED_ANYWHERE),
)
def test_a_plant_anywhere_in_any_tree_is_refused_and_a_clean_tree_opens(
    groups: list[list[str]], where: int, name: str, how: str | None
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path, outside = Path(scratch) / "sample.h5", Path(scratch)
        paths = list(dict.fromkeys("/".join(chain) for chain in groups))
        name = f"~{name}"  # never a group's name
        with h5py.File(path, "w") as h5:
            for group in paths:
                h5.require_group(group)
                h5[f"{group}/{name}"] = np.arange(6, dtype="f4")
        if how is not None:
            plant(path, f"{paths[where % len(paths)]}/{name}", how, outside)
        with no_hang():
            if how is None:
                open_h5(path).close()
                return
            with pytest.raises(DataError) as refused:
                open_h5(path)
        one_line_naming(refused.value, path)


def test_every_h5py_open_in_the_product_goes_through_open_h5() -> None:
    """An h5py.File call outside common/safeio/datasets.py may only write (a generator's own new file)."""
    reads = []
    for folder in ("benchmarks", "common", "mlhpc", "staging", "submission_checker"):
        for source in sorted((REPO / folder).rglob("*.py")):
            if source == REPO / "common" / "safeio" / "datasets.py":
                continue
            for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in ("h5py.File", "File"):
                    mode = node.args[1] if len(node.args) > 1 else None
                    if not (isinstance(mode, ast.Constant) and mode.value == "w"):
                        reads.append(f"{source.relative_to(REPO)}:{node.lineno}")
    assert reads == [], f"h5py.File opened for reading outside open_h5: {reads}"


# ---------------------------------------------------------------- the commands

@pytest.mark.parametrize("how", ["storage-on-fifo", "virtual-unlimited-on-fifo", "storage-on-file"])
def test_mlhpc_manifest_refuses_a_sample_reading_outside_itself(
    datasets: dict[str, Path], tmp_path: Path, how: str
) -> None:
    root, victim = planted(datasets, tmp_path, "deepcam-sample", how)
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    started = time.monotonic()
    proc = mlhpc("manifest", str(root), cwd=tmp_path, OMP_NUM_THREADS="1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mlhpc: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert str(victim) in proc.stderr and FIX in proc.stderr
    assert not (root / MANIFEST_NAME).exists()
    assert time.monotonic() - started < 60


def test_a_manifest_of_a_clean_dataset_and_an_inside_soft_link_is_written(
    datasets: dict[str, Path], tmp_path: Path
) -> None:
    root, _ = planted(datasets, tmp_path, "deepcam-sample", "soft-link-inside")
    assert build_manifest(root).files


@pytest.mark.parametrize(
    ("bench", "target", "how", "size"),
    [
        ("deepcam", "deepcam-sample", "storage-on-fifo", DEEPCAM_SMALL),  # hung past SIGTERM before
        ("extreme_weather", "weather-year", "storage-on-file", WEATHER_SMALL),  # trained on it before
    ],
)
def test_mlhpc_run_refuses_it_in_one_line_and_promptly(
    datasets: dict[str, Path], tmp_path: Path, bench: str, target: str, how: str, size: tuple[str, ...]
) -> None:
    root, victim = planted(datasets, tmp_path, target, how)
    args = [
        "run",
        bench,
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
    proc = mlhpc(
        *args, "--system", "ci", "--no-check", *size, cwd=tmp_path, OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local")
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mlhpc: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert str(victim) in proc.stderr and FIX in proc.stderr
    assert time.monotonic() - started < 90
