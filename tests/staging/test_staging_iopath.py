"""The I/O path a staging job reports (`request.decide_io`), and the engine's promises for one copy (`engine`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.staging import StageRequest, stage_dataset, verify_staged
from mlhpc.staging import destination as finish_module
from mlhpc.staging.engine import SLICE_BYTES, copy_file
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, build_manifest
from mlhpc.staging.request import CopyOptions, decide_io
from mlhpc.staging.source import Source, resident_bytes
from tests.helpers.cli import cli_env
from tests.helpers.datasets import dataset_files

MIB = 1 << 20


def test_auto_and_buffered_take_the_page_cache_and_say_on_what_facts() -> None:
    fits = decide_io("auto", 100 * MIB, 0.0)
    assert fits.label == "buffered" and fits.reason.startswith("auto: through the page cache")
    assert "share 100 MiB" in fits.reason and "source 0% cached" in fits.reason
    cached = decide_io("buffered", 5000 * MIB, 0.95)
    assert cached.label == "buffered" and cached.source_cached and not fits.source_cached


def test_a_removed_or_unknown_io_is_refused_saying_why() -> None:
    for io in ("fast", "direct", "kernel"):
        with pytest.raises(StagingError, match=f"io='{io}' is unknown; use one of auto, buffered .*measured slower"):
            decide_io(io, 1, 0.0)


def test_mincore_sees_what_the_page_cache_holds(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4 * MIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 4 * MIB)
        assert resident_bytes(str(path)) == (4 * MIB, 4 * MIB)
        os.fsync(fd)  # clean pages, which DONTNEED drops
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    resident, size = resident_bytes(str(path))
    assert size == 4 * MIB and resident < MIB
    assert Source(tmp_path).cached_fraction(["f.bin"]) < 0.25
    assert Source(tmp_path).cached_fraction([]) == 0.0 and resident_bytes(str(tmp_path / "missing")) == (0, 0)


def small_source(root: Path, count: int = 30, size: int = 5000) -> Path:
    for i in range(count):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i:03d}.bin").write_bytes(os.urandom(size + i))
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


@pytest.mark.parametrize("io", ["auto", "buffered"])
def test_every_io_path_stages_a_verified_copy(tmp_path: Path, io: str) -> None:
    src = small_source(tmp_path / "src")
    (src / "big.bin").write_bytes(os.urandom(2 * SLICE_BYTES + 123))  # read in slices
    build_manifest(src).write(src / MANIFEST_NAME)
    report = stage_dataset(StageRequest(src, tmp_path / "dest", io=io, workers=4))
    assert report.io is not None and report.io.label == "buffered"
    assert report.metadata()["staging_io"] == report.io.label
    assert verify_staged(tmp_path / "dest") == 31 and dataset_files(tmp_path / "dest") == dataset_files(src)


def test_a_buffered_copy_is_verified_before_it_gets_its_name(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (dest / "sub").mkdir(parents=True)
    (src / "sub").mkdir(parents=True)
    for size in (5000, 2 * SLICE_BYTES + 7):  # whole-file and sliced
        data = os.urandom(size)
        (src / "sub" / "f.bin").write_bytes(data)
        listed = FileEntry("sub/f.bin", size, xxhash.xxh3_128(b"other bytes").hexdigest())
        with pytest.raises(StagingError, match=r"sub/f\.bin fails its xxh3_128 check.*stage again"):
            copy_file(str(src), str(dest), listed, CopyOptions(umask=None))
        assert list(dest.rglob("*")) == [dest / "sub"]  # nothing renamed into place, no partial left
        good = FileEntry("sub/f.bin", size, xxhash.xxh3_128(data).hexdigest())
        staged = copy_file(str(src), str(dest), good, CopyOptions(umask=None))
        assert (dest / "sub" / "f.bin").read_bytes() == data and staged.checksum == good.checksum
        (dest / "sub" / "f.bin").unlink()


@pytest.mark.parametrize("actual", [4999, 5001, SLICE_BYTES + 1])
def test_a_buffered_copy_names_a_file_that_shrank_or_grew(tmp_path: Path, actual: int) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(os.urandom(actual))
    (tmp_path / "dest").mkdir()
    with pytest.raises(StagingError, match=r"f\.bin gave \d+ bytes, its listing says 5000.*regenerate"):
        copy_file(str(tmp_path / "src"), str(tmp_path / "dest"), FileEntry("f.bin", 5000, ""), CopyOptions())
    assert list((tmp_path / "dest").iterdir()) == []


def test_a_buffered_copy_keeps_the_source_mode_less_setuid(tmp_path: Path) -> None:
    src = small_source(tmp_path / "src", count=2)
    os.chmod(src / "d0" / "f000.bin", 0o4640)
    stage_dataset(StageRequest(src, tmp_path / "dest", io="buffered"))
    assert (tmp_path / "dest" / "d0" / "f000.bin").stat().st_mode & 0o7777 == 0o640


def test_a_buffered_copy_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    src = small_source(tmp_path / "src", count=3)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, io="buffered"))
    (dest / "d1").rename(tmp_path / "d1-moved")
    (dest / "d1").symlink_to(outside)
    with pytest.raises(StagingError, match=r"goes through the symlink 'd1'; refused"):
        stage_dataset(StageRequest(src, dest, io="buffered"))
    assert list(outside.iterdir()) == []


def test_durable_syncs_before_the_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_source(tmp_path / "src", count=3)
    synced: list[bool] = []
    real = finish_module.sync_filesystem
    monkeypatch.setattr(
        finish_module,
        "sync_filesystem",
        lambda folder: synced.append((folder / finish_module.STAGED_MARKER).exists()) or real(folder),
    )
    assert not stage_dataset(StageRequest(src, tmp_path / "plain")).durable and synced == []
    report = stage_dataset(StageRequest(src, tmp_path / "durable", durable=True))
    assert report.durable and report.metadata()["staging_durable"] is True
    assert synced == [False]  # synced once, before the marker was written


def test_the_cli_takes_io_and_durable_and_refuses_an_unknown_io(tmp_path: Path) -> None:
    src = small_source(tmp_path / "src", count=3)
    command = [sys.executable, "-m", "mlhpc", "stage", str(src), str(tmp_path / "dest")]
    done = subprocess.run(
        [*command, "--io", "buffered", "--durable"], capture_output=True, text=True, env=cli_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("I/O buffered")
    for io in ("fast", "direct"):
        bad = subprocess.run([*command, "--io", io], capture_output=True, text=True, env=cli_env())
        assert bad.returncode == 2 and f"invalid choice: '{io}'" in bad.stderr


def test_the_source_seam_reads_a_file_whole_and_holds_it_to_its_entry(tmp_path: Path) -> None:
    data = os.urandom(5000)
    (tmp_path / "a.bin").write_bytes(data)
    seam = Source(tmp_path)
    good = FileEntry("a.bin", len(data), xxhash.xxh3_128(data).hexdigest())
    assert seam.read(good, "xxh3_128") == data
    assert seam.read(FileEntry("a.bin", len(data), ""), "xxh3_128") == data  # a listing: size only
    with pytest.raises(StagingError, match=r"a\.bin fails its xxh3_128 check against the manifest"):
        seam.read(FileEntry("a.bin", len(data), xxhash.xxh3_128(b"other").hexdigest()), "xxh3_128")
    with pytest.raises(StagingError, match=r"a\.bin has 5000 bytes, its listing says 4999"):
        seam.read(FileEntry("a.bin", 4999, ""), "xxh3_128")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(StagingError, match=r"pipe is a FIFO, not a regular file"):
        seam.read(FileEntry("pipe", 1, ""), "xxh3_128")  # refused, never waited on
    with pytest.raises(StagingError, match=r"missing\.bin is missing"):
        seam.read(FileEntry("missing.bin", 1, ""), "xxh3_128")
