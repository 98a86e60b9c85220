"""Archive sources: tar, tar.gz and tar.zst extracted while staging, verified, and made safe."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from mlhpc.cli import main
from mlhpc.common.errors import StagingError
from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, build_manifest, stage_dataset, verify_staged
from mlhpc.staging.archive import sidecar_manifest
from tests.conftest import dataset_files


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for i in range(12):
        path = root / ("train" if i % 3 else "validation") / f"s{i:02d}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(700 * i))
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def pack(root: Path, archive: Path) -> Path:
    """tar up `root` (manifest included, as `tar -C root .` would), compressed by the suffix."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(root, arcname=".")
    data = raw.getvalue()
    if archive.name.endswith(".gz"):
        import gzip

        data = gzip.compress(data)
    elif archive.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    archive.write_bytes(data)
    return archive


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.zst"])
def test_archive_is_extracted_and_verified(dataset: Path, tmp_path: Path, suffix: str) -> None:
    archive = pack(dataset, tmp_path / f"data{suffix}")
    dest = tmp_path / "dest"
    report = stage_dataset(archive, dest)
    assert report.files == 12 and report.copied_files == 12
    assert report.job_read_bytes <= archive.stat().st_size
    assert dataset_files(dest) == dataset_files(dataset)
    assert verify_staged(dest) == 12


def test_member_that_disagrees_with_the_archive_manifest_is_refused(dataset: Path, tmp_path: Path) -> None:
    (dataset / "train" / "s01.npy").write_bytes(b"changed after the manifest")
    archive = pack(dataset, tmp_path / "data.tar")
    with pytest.raises(
        StagingError, match=r"s01\.npy (fails its xxh3_128 check|has \d+ bytes, its manifest)"
    ):
        stage_dataset(archive, tmp_path / "dest")
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


def test_sidecar_manifest_and_resume(dataset: Path, tmp_path: Path) -> None:
    (dataset / MANIFEST_NAME).rename(tmp_path / "manifest.json")
    archive = pack(dataset, tmp_path / "data.tar.zst")
    assert main(["stage", str(archive), "--make-manifest"]) == 0
    assert sidecar_manifest(archive).is_file()
    dest = tmp_path / "dest"
    stage_dataset(archive, dest)
    (dest / STAGED_MARKER).unlink()
    (dest / "train" / "s04.npy").unlink()
    report = stage_dataset(archive, dest)
    assert (report.copied_files, report.skipped_files) == (1, 11)
    assert verify_staged(dest) == 12


def unsafe_archive(path: Path, kind: str) -> Path:
    with tarfile.open(path, "w") as tar:
        good = tarfile.TarInfo("ok/file.bin")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"abc"))
        bad = tarfile.TarInfo(
            {"dotdot": "ok/../../evil.txt", "absolute": "/tmp/mlhpc-evil.txt", "symlink": "ok/link"}.get(
                kind, "ok/hard"
            )
        )
        if kind == "symlink":
            bad.type, bad.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
        elif kind == "hardlink":
            bad.type, bad.linkname = tarfile.LNKTYPE, "/etc/passwd"
        else:
            bad.size = 4
        tar.addfile(bad, io.BytesIO(b"evil") if bad.isfile() else None)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("dotdot", "climbs out with '..'"),
        ("absolute", "has an absolute path"),
        ("symlink", "links to '../../../etc/passwd', outside DEST"),
        ("hardlink", "links to '/etc/passwd' has an absolute path"),
    ],
)
def test_archive_path_traversal_is_refused(tmp_path: Path, kind: str, message: str) -> None:
    archive = unsafe_archive(tmp_path / "evil.tar", kind)
    dest = tmp_path / "deep" / "dest"
    with pytest.raises(StagingError, match=rf"evil\.tar: member .* {message}; refused"):
        stage_dataset(archive, dest)
    assert not (dest / STAGED_MARKER).exists()
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "deep" / "evil.txt").exists()
    assert not Path("/tmp/mlhpc-evil.txt").exists()
    assert not (dest / "ok" / "link").exists()


def test_unsafe_archive_is_a_one_line_cli_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = unsafe_archive(tmp_path / "evil.tar", "dotdot")
    assert main(["stage", str(archive), str(tmp_path / "dest")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlhpc: error: ") and "evil.tar" in err and err.count("\n") == 1
