"""Issue 31's other staging classes and issue 30's free-space check: every deletion proven (a
user's file in DEST, or one named like our temporary files, survives), a checksum-less archive
said to be one, a full disk named as such, an archive's folder modes kept, manifest entries
through a symlinked folder refused, and a dataset larger than DEST's free space refused before
anything is copied."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from mlhpc.common.errors import StagingError
from mlhpc.staging import (
    MANIFEST_NAME,
    STAGED_MARKER,
    StageRequest,
    build_manifest,
    stage_dataset,
    verify_staged,
)
from mlhpc.staging.archive import build_archive_manifest, sidecar_manifest
from mlhpc.staging.destination import STAGING_OWNED, run_tokens, space_shortfall
from tests.helpers.cli import mlhpc
from tests.helpers.datasets import dataset_files, two_file_source

# --- every deletion proven ---------------------------------------------------------------


def test_a_users_files_in_dest_survive_a_restage_after_the_source_changed(tmp_path: Path) -> None:
    """A user's file in DEST is not ours to remove, and a loader would read it as data: the
    restage refuses in one line naming it, before the marker, and removes nothing of it."""
    src, dest = two_file_source(tmp_path / "src", settled=True), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    (dest / "sub" / "results.csv").write_text("mine")  # not in the source, never staged: not ours
    (src / "sub" / "b.bin").unlink()  # its copy is ours and unchanged: it goes
    (src / "a.bin").write_bytes(b"A" * 7)
    with pytest.raises(StagingError, match=r"holds sub/results\.csv, which .* does not have and no staging"):
        stage_dataset(StageRequest(src, dest, workers=2))
    assert (dest / "sub" / "results.csv").read_text() == "mine" and not (dest / STAGED_MARKER).exists()
    (dest / "sub" / "results.csv").rename(tmp_path / "results.csv")  # the fix the line names
    stage_dataset(StageRequest(src, dest, workers=2))
    assert dataset_files(dest) == dataset_files(src) and (dest / "a.bin").read_bytes() == b"A" * 7


def test_a_file_named_like_our_temporary_file_is_not_removed_without_our_token(tmp_path: Path) -> None:
    src, dest = two_file_source(tmp_path / "src", settled=True), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    (token,) = run_tokens(dest)
    theirs = [dest / ".a.bin.mlhpc-partial", dest / "sub" / ".b.bin.ffffffffffff.mlhpc-partial"]
    ours = dest / "sub" / f".b.bin.{token}.mlhpc-partial"  # a leftover of our own killed run
    for path in [*theirs, ours]:
        path.write_text("x")
    (src / "a.bin").write_bytes(b"changed")
    stage_dataset(StageRequest(src, dest, workers=2))
    assert all(path.read_text() == "x" for path in theirs) and not ours.exists()
    assert verify_staged(dest) == 2


def test_a_dest_with_a_users_file_and_no_staging_bookkeeping_is_left_untouched(tmp_path: Path) -> None:
    src, dest = two_file_source(tmp_path / "src", settled=True), tmp_path / "dest"
    dest.mkdir()
    (dest / ".x.0123456789ab.mlhpc-partial").write_text("a user's file with our suffix")
    (dest / "keep.txt").write_text("k")
    with pytest.raises(StagingError, match="which mlhpc did not stage"):
        stage_dataset(StageRequest(src, dest, workers=2))
    assert sorted(p.name for p in dest.iterdir()) == [".x.0123456789ab.mlhpc-partial", "keep.txt"]


def test_the_ownership_file_records_each_run(tmp_path: Path) -> None:
    src, dest = two_file_source(tmp_path / "src", settled=True), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    stage_dataset(StageRequest(src, dest, workers=2))
    assert len(run_tokens(dest)) == 2 and (dest / STAGING_OWNED).read_text().count("run ") == 2
    assert not list(dest.glob(".mlhpc_journal*"))  # each run's journals: removed, their lines kept


# --- archives ---------------------------------------------------------------------------


def tar_bytes(members: dict[str, bytes], folders: dict[str, int] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, mode in (folders or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_checksumless_zst_with_a_flipped_byte_is_staged_with_a_warning(tmp_path: Path) -> None:
    """What a .tar.zst without frame checksums and without a manifest can promise: nothing about
    its members' bytes. `mlhpc stage` says so; with a manifest made before the damage it refuses."""
    payload = os.urandom(64 << 10)  # incompressible: zstd stores it raw, so a flipped byte decodes
    data = bytearray(zstandard.ZstdCompressor(write_checksum=False).compress(tar_bytes({"x.bin": payload})))
    archive = tmp_path / "data.tar.zst"
    archive.write_bytes(bytes(data))
    build_archive_manifest(archive).write(tmp_path / "saved.json")
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    proc = mlhpc("stage", archive, tmp_path / "dest")
    assert proc.returncode == 0, proc.stderr
    assert "mlhpc: warning: " in proc.stderr and "zstd frames carry no checksum" in proc.stderr
    assert f"mlhpc manifest {archive}" in proc.stderr
    assert (tmp_path / "dest" / "x.bin").read_bytes() != payload  # the damage went through, as warned
    (tmp_path / "saved.json").rename(sidecar_manifest(archive))
    proc = mlhpc("stage", archive, tmp_path / "dest2")
    assert proc.returncode == 2 and "fails its xxh3_128 check" in proc.stderr and "warning" not in proc.stderr


def test_a_checksummed_zst_and_a_gz_carry_no_warning(tmp_path: Path) -> None:
    for name, data in (
        ("c.tar.zst", zstandard.ZstdCompressor(write_checksum=True).compress(tar_bytes({"x": b"x"}))),
        ("c.tar.gz", gzip.compress(tar_bytes({"x": b"x"}))),
    ):
        (tmp_path / name).write_bytes(data)
        assert stage_dataset(StageRequest(tmp_path / name, tmp_path / f"dest-{name}")).warnings == ()
    (tmp_path / "p.tar").write_bytes(tar_bytes({"x": b"x"}))
    (warning,) = stage_dataset(StageRequest(tmp_path / "p.tar", tmp_path / "dest-p")).warnings
    assert "a .tar carries no checksum of its members' bytes" in warning


def test_an_archives_folder_modes_are_kept_safely(tmp_path: Path, umask_022: None) -> None:
    archive = tmp_path / "d.tar"
    folders = {"private": 0o700, "shared": 0o2775, "open": 0o777, "empty": 0o750}
    archive.write_bytes(tar_bytes({"private/f": b"1", "shared/g": b"2", "open/h": b"3"}, folders))
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(archive, dest))
    modes = {name: (dest / name).stat().st_mode & 0o7777 for name in folders}
    assert modes == {"private": 0o700, "shared": 0o755, "open": 0o755, "empty": 0o750}


@pytest.fixture
def umask_022() -> object:
    old = os.umask(0o022)
    yield None
    os.umask(old)


def test_a_tar_gz_on_a_full_disk_says_disk_full(tmp_path: Path) -> None:
    from tests.helpers.mounts import tmpfs

    archive = tmp_path / "zeros.tar.gz"
    archive.write_bytes(gzip.compress(tar_bytes({f"z{i}.bin": bytes(3 << 20) for i in range(3)})))
    with tmpfs(tmp_path / "small", "size=2m") as disk:
        proc = mlhpc("stage", archive, disk / "dest")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"disk full while writing {disk / 'dest'}/" in proc.stderr and "bytes free" in proc.stderr
        assert "short write" not in proc.stderr and not (disk / "dest" / STAGED_MARKER).exists()


# --- manifests through symlinked folders --------------------------------------------------


def test_manifest_entries_through_a_symlinked_folder_are_refused(tmp_path: Path) -> None:
    src = two_file_source(tmp_path / "src", settled=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.bin").write_bytes(b"not the dataset's")
    (src / "jump").symlink_to(tmp_path / "elsewhere")
    build_manifest(src, files=["a.bin", "sub/b.bin", "jump/secret.bin"]).write(src / MANIFEST_NAME)
    with pytest.raises(StagingError, match=r"entry 'jump/secret\.bin' goes through .*jump, a symbolic link"):
        stage_dataset(StageRequest(src, tmp_path / "dest"))
    assert not (tmp_path / "dest" / "jump").exists()


# --- free space (issue 30) ----------------------------------------------------------------


def test_space_shortfall_names_both_sizes_and_dest() -> None:
    assert space_shortfall("/local/x", 10**9, 2 * 10**9) is None
    assert space_shortfall("/local/x", 0, 0) is None
    line = space_shortfall("/local/x", 2 * 10**12, 5 * 10**11)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "not enough space on /local/x: staging needs 2000000000000 bytes, 500000000000 are free"
    )
    assert "(2.0 TB needed" in line and "500.0 GB free" in line
    assert space_shortfall("/x", 1000, 1010) is None and space_shortfall("/x", 1000, 1009) is not None
    assert space_shortfall("/x", 10**10, 10**10) is not None  # the margin: 1 % up to 64 MiB


def test_a_terabyte_source_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    """A sparse file of 1 TB apparent size as the source: the sizes are compared before copying."""
    src = two_file_source(tmp_path / "src", settled=True)
    with open(src / "huge.bin", "wb") as handle:
        handle.truncate(10**12)
    proc = mlhpc("stage", src, tmp_path / "dest")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"not enough space on {tmp_path / 'dest'}: staging needs {10**12 + 150} bytes" in proc.stderr
    assert "1.0 TB needed" in proc.stderr and "set MLHPC_LOCAL_DIR" in proc.stderr
    assert dataset_files(tmp_path / "dest") == {}
