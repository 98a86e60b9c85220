"""Staging: verified copies, the completion marker, and the errors a site will meet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlhpc.common.errors import StagingError
from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, build_manifest, stage_dataset, verify_staged
from mlhpc.staging.manifest import FileEntry, Manifest, hash_file
from mlhpc.staging.plan import plan_node_copies
from mlhpc.staging.stage import check_free_space


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for i in range(7):
        path = root / ("train" if i % 2 else "validation") / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (1000 * (i + 1)))
    return root


def test_stage_copies_verifies_and_marks_complete(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    report = stage_dataset(source, dest)
    assert report.files == 7
    assert report.bytes == sum(1000 * (i + 1) for i in range(7))
    for path in source.rglob("*.bin"):
        assert (dest / path.relative_to(source)).read_bytes() == path.read_bytes()
    assert (dest / STAGED_MARKER).is_file()
    assert not list(dest.rglob("*.mlhpc-partial"))
    assert verify_staged(dest) == 7
    assert set(report.metadata()) == {"staging_duration", "staged_files", "staged_bytes"}


def test_source_manifest_is_used_and_checked(source: Path, tmp_path: Path) -> None:
    build_manifest(source).write(source / MANIFEST_NAME)
    victim = source / "train" / "f1.bin"
    victim.write_bytes(b"\x09" * victim.stat().st_size)  # same size, other bytes
    with pytest.raises(StagingError, match=r"f1\.bin fails its xxh3_128 check: the source changed"):
        stage_dataset(source, tmp_path / "dest")
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


def test_corrupted_staged_file_is_detected(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    stage_dataset(source, dest)
    victim = dest / "validation" / "f2.bin"
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(StagingError, match=r"staged file .*f2\.bin is corrupt"):
        verify_staged(dest)


def test_missing_source_file_is_named(source: Path, tmp_path: Path) -> None:
    build_manifest(source).write(source / MANIFEST_NAME)
    (source / "train" / "f3.bin").unlink()
    with pytest.raises(StagingError, match=r"f3\.bin is missing"):
        stage_dataset(source, tmp_path / "dest")


def test_half_staged_directory_is_not_taken_for_whole(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    stage_dataset(source, dest)
    (dest / STAGED_MARKER).unlink()
    with pytest.raises(StagingError, match="no complete staged dataset"):
        verify_staged(dest)


def test_restaging_replaces_a_stale_copy(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    stage_dataset(source, dest)
    (dest / "train" / "f1.bin").write_bytes(b"stale")
    stage_dataset(source, dest)
    assert verify_staged(dest) == 7


def test_not_enough_space_is_refused_before_copying(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(StagingError, match=rf"needs {free * 2} bytes, \d+ are free"):
        check_free_space(tmp_path / "dest", free * 2)


def test_missing_source_directory(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="is not a directory"):
        stage_dataset(tmp_path / "nope", tmp_path / "dest")


def test_planner_splits_every_file_once_and_balances_bytes() -> None:
    manifest = Manifest(
        "xxh3_128", tuple(FileEntry(f"f{i}", size, "x") for i, size in enumerate([9, 7, 5, 3, 1, 1]))
    )
    shares = [plan_node_copies(manifest, rank, 3) for rank in range(3)]
    paths = [op.entry.path for share in shares for op in share]
    assert sorted(paths) == sorted(f.path for f in manifest.files)
    loads = [sum(op.entry.size for op in share) for share in shares]
    assert max(loads) - min(loads) <= 2
    with pytest.raises(ValueError):
        plan_node_copies(manifest, 3, 3)


def test_two_local_ranks_split_the_work(source: Path, tmp_path: Path) -> None:
    """Two ranks of one node, run one after the other with a no-op barrier, build one complete copy."""
    dest = tmp_path / "dest"
    first = stage_dataset(source, dest, local_rank=1, local_size=2)
    assert not (dest / STAGED_MARKER).exists()  # only local rank 0 marks the copy complete
    stage_dataset(source, dest, local_rank=0, local_size=2)
    assert first.files == 7
    assert verify_staged(dest) == 7


def test_sha256_on_request(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    assert hash_file(path, "sha256") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
