"""The I/O level on real generated mini datasets, read through each benchmark's own torch loader."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from mlhpc.characterize.bench_workload import single_process_context
from mlhpc.characterize.io_level import measure_io
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError

NUM_SAMPLES = 16  # one mini global batch: build_data refuses fewer
SAMPLES = 12


# What rchar counts beyond the sample files' bytes: numpy reads an .npy file's first block, seeks
# back and reads it again (about 4 KiB more for the data file, 400 bytes for the tiny label file);
# HDF5 reads its superblock and object headers, a few hundred bytes, some of them twice. So per
# sample: within one 8 KiB buffer per file plus 1 % of the files' bytes.
def _bytes_tolerance(file_bytes: float, files: int) -> float:
    return 0.01 * file_bytes + 8192 * files


def _train_dataset(name: str, root: Path) -> Any:
    """The map-style dataset behind `build_data(...).train` on a freshly generated mini dataset."""
    bench = registry.get(name)
    cfg = load_config(bench.config_class, bench.config_path("mini"), ["data.loader=torch"])
    bench.generate(cfg, root, num_samples=NUM_SAMPLES, seed=3)
    return bench.build_data(cfg, root, single_process_context(torch.device("cpu")), 0).train.dataset


@pytest.mark.parametrize("name", ["cosmoflow", "deepcam"])
def test_reads_the_sample_files_bytes_per_sample(name: str, tmp_path: Path) -> None:
    dataset = _train_dataset(name, tmp_path / "data")
    level = measure_io(dataset, samples=SAMPLES, seed=7, evict=True)
    json.dumps(dataclasses.asdict(level))  # the page's JSON takes it as it is
    print(name, json.dumps(dataclasses.asdict(level)))
    assert level.samples == SAMPLES and level.dataset_samples == NUM_SAMPLES
    with pytest.raises(dataclasses.FrozenInstanceError):
        level.samples = 1  # type: ignore[misc]
    assert level.counter is not None, "no /proc I/O counters on this machine"
    for run in (level.first_touch, level.second_touch):
        assert 0 < run.latency_p50_s <= run.latency_p99_s <= run.latency_max_s
        assert run.read_bytes_per_sample is not None
        extra = run.read_bytes_per_sample - level.file_bytes_per_sample
        assert 0 <= extra <= _bytes_tolerance(level.file_bytes_per_sample, len(dataset.sample_files(0)))
        assert run.bandwidth_bytes_per_s is not None and run.bandwidth_bytes_per_s > 0
        assert run.samples_per_s is not None and run.samples_per_s > 0
    # The second touch is served from the page cache: nothing comes from the device.
    assert level.second_touch.storage_bytes_per_sample == 0


def test_eviction_makes_the_first_touch_read_the_device(tmp_path: Path) -> None:
    """posix_fadvise needs no root; where the file system keeps pages apart from its storage (not
    tmpfs), the evicted first touch fetches at least the files' bytes from the device."""
    dataset = _train_dataset("cosmoflow", tmp_path / "data")
    level = measure_io(dataset, samples=4, seed=1, evict=True)
    if not level.evicted:
        pytest.skip("posix_fadvise is not available here")
    fetched = level.first_touch.storage_bytes_per_sample
    if fetched == 0:
        pytest.skip(f"{tmp_path} keeps no pages apart from its storage (tmpfs): nothing to evict")
    assert fetched is not None and fetched >= level.file_bytes_per_sample


def test_draws_are_seeded_and_without_replacement(tmp_path: Path) -> None:
    dataset = _Recorder(_train_dataset("cosmoflow", tmp_path / "data"))
    measure_io(dataset, samples=NUM_SAMPLES, seed=5)
    read = dataset.read
    warm_up, first, second = read[0], read[1 : NUM_SAMPLES + 1], read[NUM_SAMPLES + 1 :]
    assert sorted(first) == list(range(NUM_SAMPLES))  # every sample once: no replacement
    assert second == first  # the second touch rereads the same samples
    assert warm_up == first[0]  # no sample outside the draw: the warm-up read takes the first drawn
    dataset.read.clear()
    measure_io(dataset, samples=NUM_SAMPLES, seed=5)
    assert dataset.read[1 : NUM_SAMPLES + 1] == first
    dataset.read.clear()
    measure_io(dataset, samples=4, seed=5)
    assert dataset.read[0] not in dataset.read[1:]  # the warm-up read is outside the draw


@pytest.mark.parametrize(("samples", "needle"), [(0, "at least 1"), (NUM_SAMPLES + 1, "at most 16")])
def test_refuses_a_sample_count_the_dataset_cannot_give(samples: int, needle: str, tmp_path: Path) -> None:
    dataset = _train_dataset("cosmoflow", tmp_path / "data")
    with pytest.raises(ConfigError, match=needle):
        measure_io(dataset, samples=samples, seed=0)


class _Recorder:
    """The real dataset, noting which samples were read in which order."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.read.append(index)
        return self.dataset[index]

    def sample_files(self, index: int) -> tuple[Path, ...]:
        return self.dataset.sample_files(index)


def test_dropping_cached_pages_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    """A sample file that is really a FIFO (a hostile --data) is left alone, not opened to block."""
    from mlhpc.characterize.io_level import _drop_cached_pages

    fifo = tmp_path / "sample_data.npy"
    os.mkfifo(fifo)
    regular = tmp_path / "regular.npy"
    regular.write_bytes(b"x" * 4096)
    assert _drop_cached_pages(fifo) is False
    assert _drop_cached_pages(regular) is True
