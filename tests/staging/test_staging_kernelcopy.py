"""The kernel copy (`buffered.copy_kernel`, `--io kernel`): the same promises as the buffered
copy. The copy is hashed from its own pages and verified before it gets its name; a source
whose size is not its listed one, or that shrinks or grows during the copy, is refused; no
planted link is followed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import xxhash

from mlhpc.common.errors import StagingError
from mlhpc.staging import StageRequest, buffered, stage_dataset, verify_staged
from mlhpc.staging.buffered import KERNEL_COPY_MIN_BYTES, KERNEL_SLICE_BYTES, copy_kernel
from mlhpc.staging.manifest import MANIFEST_NAME, FileEntry, build_manifest
from mlhpc.staging.sink import forget_checked_dirs
from tests.helpers.datasets import dataset_files

SIZES = [5000, 2 * KERNEL_SLICE_BYTES + 7]  # one piece, and several slices with a short last one


def source(tmp_path: Path, size: int) -> tuple[Path, Path, bytes]:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "sub").mkdir(parents=True)
    (dest / "sub").mkdir(parents=True)
    data = os.urandom(size)
    (src / "sub" / "f.bin").write_bytes(data)
    return src, dest, data


def entry(size: int, data: bytes) -> FileEntry:
    return FileEntry("sub/f.bin", size, xxhash.xxh3_128(data).hexdigest())


@pytest.mark.parametrize("size", SIZES)
def test_a_kernel_copy_is_verified_before_it_gets_its_name(tmp_path: Path, size: int) -> None:
    src, dest, data = source(tmp_path, size)
    wrong = FileEntry("sub/f.bin", size, xxhash.xxh3_128(b"other bytes").hexdigest())
    with pytest.raises(StagingError, match=r"sub/f\.bin fails its xxh3_128 check.*stage again"):
        copy_kernel(str(src), str(dest), wrong, "xxh3_128", None)
    assert list(dest.rglob("*")) == [dest / "sub"]  # nothing renamed into place, no partial left
    staged = copy_kernel(str(src), str(dest), entry(size, data), "xxh3_128", None)
    assert (dest / "sub" / "f.bin").read_bytes() == data
    assert staged.checksum == entry(size, data).checksum and staged.size == size


def test_a_kernel_copy_hashes_short_copies_at_unaligned_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copy_file_range may copy less than asked: each piece is hashed from where it starts."""
    size = KERNEL_SLICE_BYTES + 5
    src, dest, data = source(tmp_path, size)
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda i, o, n, at: real(i, o, min(n, 12345), at))
    copy_kernel(str(src), str(dest), entry(size, data), "xxh3_128", None)
    assert (dest / "sub" / "f.bin").read_bytes() == data


def test_a_kernel_copy_falls_back_to_sendfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = 2 * KERNEL_SLICE_BYTES + 7
    src, dest, data = source(tmp_path, size)

    def refused(*args: object) -> int:  # another file system (EXDEV) or an old kernel
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refused)
    sent: list[int] = []
    real = os.sendfile
    monkeypatch.setattr(os, "sendfile", lambda o, i, at, n: sent.append(n) or real(o, i, at, n))
    copy_kernel(str(src), str(dest), entry(size, data), "xxh3_128", None)
    assert (dest / "sub" / "f.bin").read_bytes() == data and sent


@pytest.mark.parametrize("listed", [4999, 5001])
def test_a_kernel_copy_refuses_a_source_of_another_size_before_writing(tmp_path: Path, listed: int) -> None:
    src, dest, _ = source(tmp_path, 5000)
    with pytest.raises(StagingError, match=rf"f\.bin gave 5000 bytes, its listing says {listed}.*regenerate"):
        copy_kernel(str(src), str(dest), FileEntry("sub/f.bin", listed, ""), "xxh3_128", None)
    assert list(dest.rglob("*")) == [dest / "sub"]


@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_a_kernel_copy_refuses_a_source_that_changes_during_the_copy(tmp_path: Path, change: str) -> None:
    size = 2 * KERNEL_SLICE_BYTES + 7
    src, dest, data = source(tmp_path, size)
    path = src / "sub" / "f.bin"

    def meddle() -> None:  # runs before the second slice
        if change == "shrink":
            os.truncate(path, KERNEL_SLICE_BYTES + 1)
        elif path.stat().st_size == size:
            with open(path, "ab") as handle:
                handle.write(b"more")

    with pytest.raises(
        StagingError, match=r"f\.bin gave \d+ bytes, its listing says \d+.*the source changed"
    ):
        copy_kernel(str(src), str(dest), entry(size, data), "xxh3_128", None, meddle)
    assert list(dest.rglob("*")) == [dest / "sub"]


def test_a_kernel_copy_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    src, dest, data = source(tmp_path, 5000)
    outside = tmp_path / "outside"
    outside.write_bytes(b"theirs")
    (dest / "sub" / ".f.bin.mlhpc-partial").symlink_to(outside)  # at the copy's temporary name
    with pytest.raises(StagingError):
        copy_kernel(str(src), str(dest), entry(5000, data), "xxh3_128", None)
    assert outside.read_bytes() == b"theirs" and not (dest / "sub" / "f.bin").exists()
    (dest / "sub" / ".f.bin.mlhpc-partial").unlink(missing_ok=True)  # a partial name is staging's
    (dest / "sub").rmdir()
    (dest / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    forget_checked_dirs()  # as a new staging run starts
    with pytest.raises(StagingError, match=r"goes through the symlink 'sub'; refused"):
        copy_kernel(str(src), str(dest), entry(5000, data), "xxh3_128", None)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_kernel_copy_keeps_the_source_mode_less_setuid(tmp_path: Path) -> None:
    src, dest, data = source(tmp_path, 5000)
    os.chmod(src / "sub" / "f.bin", 0o4640)
    copy_kernel(str(src), str(dest), entry(5000, data), "xxh3_128", 0o022)
    assert (dest / "sub" / "f.bin").stat().st_mode & 0o7777 == 0o640


def test_io_kernel_stages_large_files_in_the_kernel_and_small_ones_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "big.bin").write_bytes(os.urandom(KERNEL_COPY_MIN_BYTES + 123))
    for i in range(5):
        (src / "d" / f"small{i}.bin").write_bytes(os.urandom(1000 + i))
    build_manifest(src).write(src / MANIFEST_NAME)
    kernel: list[str] = []
    real = buffered.copy_kernel
    monkeypatch.setattr(
        "mlhpc.staging.copy.copy_kernel", lambda s, d, e, *rest: kernel.append(e.path) or real(s, d, e, *rest)
    )
    report = stage_dataset(StageRequest(src, tmp_path / "dest", io="kernel", workers=2))
    assert report.io is not None and report.io.label == "buffered, kernel copy"
    assert report.metadata()["staging_io"] == "buffered, kernel copy"
    assert kernel == ["d/big.bin"]
    assert verify_staged(tmp_path / "dest") == 6 and dataset_files(tmp_path / "dest") == dataset_files(src)
