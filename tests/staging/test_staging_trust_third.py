"""Staging, third trust pass (issue 39): a .tar.zst whose first frame has a checksum and a later
one none is refused rather than staged unchecked with no warning; on a source whose identity
evidence is weak (FUSE such as sshfs: ctime the server's, inode numbers FUSE's; whole-second
timestamps) a restage decides on content, never on a size, mtime and inode put back."""

from __future__ import annotations

import io
import logging
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.common.errors import StagingError
from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, StageRequest, build_manifest, stage_dataset
from mlhpc.staging import source as origin
from mlhpc.staging.archive import build_archive_manifest, sidecar_manifest
from tests.helpers.datasets import dataset_files

# ---------------------------------------------------------------- zstd frames, every one checked
FILES = {f"d/f{i}.bin": random.Random(i).randbytes(3000 + 700 * i) for i in range(8)}


def tar_of(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def frames(data: bytes, checks: list[bool]) -> list[bytes]:
    """`data` cut into len(checks) pieces, each its own zstd frame, with a checksum or not."""
    cuts = [len(data) * i // len(checks) for i in range(len(checks) + 1)]
    return [
        zstandard.ZstdCompressor(write_checksum=check).compress(data[a:b])
        for check, a, b in zip(checks, cuts[:-1], cuts[1:], strict=True)
    ]


def silent_flip(frame: bytes, pick: random.Random) -> bytes:
    """`frame` with one byte flipped where zstd, checksum aside, still decodes it to the same
    length (a byte of a random member stored raw): only a frame checksum can tell. The place is
    found on the same frame without its checksum (the same layout, the 4 bytes at the end aside)."""
    descriptor = frame[4]
    bare = bytearray(frame[:-4] if descriptor & 0x04 else frame)
    bare[4] = descriptor & ~0x04
    clean = zstandard.ZstdDecompressor().decompress(bytes(bare))
    low, high = len(bare) // 4, len(bare) - 8
    start = pick.randrange(low, high)
    for at in [*range(start, high), *range(low, start)]:
        bare[at] ^= 0x01
        try:
            out = zstandard.ZstdDecompressor().decompress(bytes(bare))
        except zstandard.ZstdError:
            out = b""
        bare[at] ^= 0x01
        if len(out) == len(clean) and out != clean:
            flipped = bytearray(frame)
            flipped[at] ^= 0x01
            return bytes(flipped)
    raise AssertionError("no silent flip in this frame")


def archive(tmp_path: Path, parts: list[bytes]) -> Path:
    path = tmp_path / "in" / "a.tar.zst"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"".join(parts))
    return path


def staged(path: Path, dest: Path) -> tuple[dict[str, bytes] | None, tuple[str, ...], str]:
    """(what DEST holds, the report's warnings, '') when staged; (None, (), the one line) when refused."""
    try:
        report = stage_dataset(StageRequest(path, dest, workers=2))
    except StagingError as e:
        assert "\n" not in str(e) and not (dest / STAGED_MARKER).exists(), str(e)
        left = dataset_files(dest)  # members verified against a manifest stay, for the resume
        assert all(FILES.get(name) == data for name, data in left.items()), "a damaged member was left"
        return None, (), str(e)
    return dataset_files(dest), report.warnings, ""


def test_a_flipped_byte_in_an_unchecked_later_frame_is_refused(tmp_path: Path) -> None:
    """The issue's case: before, it staged the flipped byte with no warning."""
    parts = frames(tar_of(FILES), [True, False, True])
    parts[1] = silent_flip(parts[1], random.Random(1))
    path = archive(tmp_path, parts)
    held, _, line = staged(path, tmp_path / "dest")
    assert held is None, "staged a flipped byte unnoticed"
    assert str(path) in line and "zstd frame 2" in line and "no checksum" in line, line
    assert f"byte {len(parts[0])}" in line and "mlhpc manifest" in line, line


def test_a_clean_mixed_archive_is_refused_too_unless_a_manifest_checks_it(tmp_path: Path) -> None:
    """The refusal is of the broken promise, not of one damage; a sidecar manifest (written where
    the archive was made) checks every member, and then a flip fails its checksum."""
    parts = frames(tar_of(FILES), [True, False])
    path = archive(tmp_path, parts)
    assert staged(path, tmp_path / "dest")[0] is None
    build_archive_manifest(path).write(sidecar_manifest(path))  # `mlhpc manifest` takes it
    held, warnings, _ = staged(path, tmp_path / "dest2")
    assert held == FILES and warnings == ()
    path.write_bytes(parts[0] + silent_flip(parts[1], random.Random(2)))
    held, _, line = staged(path, tmp_path / "dest3")
    assert held is None and "fails its xxh3_128 check" in line, line


def test_an_unchecked_first_frame_is_the_warning_and_all_checked_frames_stage(tmp_path: Path) -> None:
    held, warnings, _ = staged(archive(tmp_path, frames(tar_of(FILES), [False, True])), tmp_path / "dest")
    assert held == FILES and len(warnings) == 1 and "no checksum" in warnings[0], warnings
    held, warnings, _ = staged(archive(tmp_path, frames(tar_of(FILES), [True] * 3)), tmp_path / "dest2")
    assert held == FILES and warnings == ()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    checks=st.lists(st.booleans(), min_size=1, max_size=4),
    flip=st.none() | st.integers(0, 3),
    pick=st.randoms(use_true_random=False),
)
def test_property_a_zst_stages_whole_or_warned_or_is_refused(
    checks: list[bool], flip: int | None, pick: random.Random
) -> None:
    """Whatever its frames' checksums and wherever one byte is flipped: DEST holds the archive's
    files exactly, or the report warns that it is unchecked, or the stage refuses in one line."""
    parts = frames(tar_of(FILES), checks)
    if flip is not None:
        parts[flip % len(parts)] = silent_flip(parts[flip % len(parts)], pick)
    with tempfile.TemporaryDirectory() as scratch:
        held, warnings, _ = staged(archive(Path(scratch), parts), Path(scratch) / "dest")
    if held is not None and held != FILES:
        assert warnings and not checks[0], "different bytes staged with no warning"


# ---------------------------------------------------------------- weak identity evidence
SOURCE = {"a.bin": b"a" * 1000, "sub/b.bin": b"b" * 3000, "sub/c.bin": b"c" * 10}


def make_source(root: Path, manifest: bool) -> Path:
    for name, data in SOURCE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    if manifest:
        build_manifest(root).write(root / MANIFEST_NAME)
    time.sleep(2 * origin.RACY_NS / 1e9)  # settled: a fresh file records no identity anyway
    return root


def rewrite_putting_back(path: Path, data: bytes) -> None:
    """Same size, other bytes, the mtime set back (`touch -d`): on sshfs the ctime follows it."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.fixture
def sshfs_like(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake sshfs: the mount table says FUSE, and a file's identity is what sshfs can show
    (size, mtime, and a ctime that is the mtime; the inode numbers are FUSE's, left out)."""
    monkeypatch.setattr(origin, "_fs_type", lambda dev: "fuse.sshfs")
    monkeypatch.setattr(origin, "identity", lambda info: f"{info.st_size}:{info.st_mtime_ns}:{info.st_dev}")


def test_on_sshfs_a_file_put_back_is_copied_again(
    tmp_path: Path, sshfs_like: None, caplog: pytest.LogCaptureFixture
) -> None:
    src, dest = make_source(tmp_path / "src", manifest=False), tmp_path / "dest"
    with caplog.at_level(logging.WARNING, logger="mlhpc.staging"):
        stage_dataset(StageRequest(src, dest, workers=2))
    said = [r.getMessage() for r in caplog.records if "FUSE" in r.getMessage()]
    assert len(said) == 1 and str(src) in said[0] and "copies every file again" in said[0], said
    rewrite_putting_back(src / "sub" / "b.bin", b"B" * 3000)
    report = stage_dataset(StageRequest(src, dest, workers=2))
    assert dataset_files(dest) == dataset_files(src), "a restage kept stale data"
    assert (report.copied_files, report.skipped_files) == (3, 0)


def test_on_sshfs_with_a_manifest_copies_are_kept_on_its_checksums(
    tmp_path: Path, sshfs_like: None, caplog: pytest.LogCaptureFixture
) -> None:
    src, dest = make_source(tmp_path / "src", manifest=True), tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=2))
    with caplog.at_level(logging.WARNING, logger="mlhpc.staging"):
        report = stage_dataset(StageRequest(src, dest, workers=2))
    assert (report.copied_files, report.skipped_files, report.checked_by) == (0, 3, "checksums")
    assert any("manifest's checksum" in r.getMessage() for r in caplog.records)
    build_manifest(src).write(src / MANIFEST_NAME)  # unchanged content: still kept
    rewrite_putting_back(src / "sub" / "b.bin", b"B" * 3000)
    build_manifest(src).write(src / MANIFEST_NAME)  # the owner regenerated it: the change restages
    report = stage_dataset(StageRequest(src, dest, workers=2))
    assert dataset_files(dest) == dataset_files(src) and report.copied_files == 1


def test_the_control_without_weak_evidence_keeps_an_unchanged_source(tmp_path: Path) -> None:
    """On this machine's own file system identity is evidence: nothing is copied twice."""
    src, dest = make_source(tmp_path / "src", manifest=False), tmp_path / "dest"
    assert origin.weak_evidence((src / "a.bin").stat()) is None
    stage_dataset(StageRequest(src, dest, workers=2))
    report = stage_dataset(StageRequest(src, dest, workers=2))
    assert (report.copied_files, report.skipped_files) == (0, 3)


@pytest.mark.parametrize(
    ("fs_type", "mtime_ns", "ctime_ns", "weak"),
    [
        ("fuse.sshfs", 1_700_000_000_123_456_789, 1_700_000_000_123_456_789, "FUSE"),
        ("fuse", 1, 2, "FUSE"),
        ("fuseblk", 1, 2, "FUSE"),
        ("ext4", 1_700_000_000_000_000_000, 1_700_000_001_000_000_000, "whole-second"),
        ("ext4", 1_700_000_000_000_000_000, 1_700_000_000_000_000_001, None),  # tar's whole mtime
        ("lustre", 5, 7, None),
        ("", 5, 7, None),
    ],
)
def test_weak_evidence_is_told_by_fs_type_and_clock(
    monkeypatch: pytest.MonkeyPatch, fs_type: str, mtime_ns: int, ctime_ns: int, weak: str | None
) -> None:
    monkeypatch.setattr(origin, "_fs_type", lambda dev: fs_type)
    info = SimpleNamespace(st_dev=1, st_mtime_ns=mtime_ns, st_ctime_ns=ctime_ns, st_size=1, st_ino=1)
    why = origin.weak_evidence(info)  # type: ignore[arg-type]
    assert (why is None) if weak is None else (why is not None and weak in why), why
    assert (origin.recorded_identity(info) == "") == (weak is not None)  # type: ignore[arg-type]


def test_the_mount_table_names_this_machines_file_systems() -> None:
    """The real detection (no monkeypatch): /proc itself is `proc`, a temp folder not FUSE."""
    assert origin._fs_type(os.stat("/proc").st_dev) == "proc"
    assert not origin._fs_type(os.stat(tempfile.gettempdir()).st_dev).startswith("fuse")


# ---------------------------------------------------------------- a real sshfs, where CI has one
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/lib/sftp-server", "/usr/libexec/openssh/sftp-server")


def _sshfs_missing() -> str | None:
    for tool in ("sshfs", "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install sshfs)"
    if not any(os.access(p, os.X_OK) for p in SFTP_SERVERS):
        return "no sftp-server (apt-get install openssh-server)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not usable here"
    return None


@pytest.mark.skipif((why := _sshfs_missing()) is not None, reason=str(why))
def test_a_real_sshfs_source_put_back_is_restaged(tmp_path: Path) -> None:
    """sshfs over a pipe to sftp-server (no network): the identity really is put back there."""
    src, mnt, dest = make_source(tmp_path / "src", manifest=False), tmp_path / "mnt", tmp_path / "dest"
    mnt.mkdir()
    old = time.time_ns() - 60 * 10**9  # sshfs shows this as the ctime too: out of the racy window
    for name in SOURCE:
        os.utime(src / name, ns=(old, old))
    server = next(p for p in SFTP_SERVERS if os.access(p, os.X_OK))
    (shim := tmp_path / "ssh").write_text(f"#!/bin/sh\nexec {server}\n")
    shim.chmod(0o755)
    sshfs = subprocess.Popen(
        ["sshfs", "-f", "-o", f"ssh_command={shim},dir_cache=no", f"x:{src}", str(mnt)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 5
        while not os.path.ismount(mnt) and sshfs.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.ismount(mnt):
            pytest.skip(
                f"sshfs could not mount here: {sshfs.stderr.read(300) if sshfs.poll() else 'timeout'}"
            )
        victim = mnt / "sub" / "b.bin"
        stage_dataset(StageRequest(mnt, dest, workers=2))
        before = origin.identity(victim.stat())
        rewrite_putting_back(victim, b"B" * 3000)
        assert origin.identity(victim.stat()) == before, "sshfs moved the ctime: the attack is not real here"
        stage_dataset(StageRequest(mnt, dest, workers=2))
        assert (dest / "sub" / "b.bin").read_bytes() == b"B" * 3000, "a restage kept stale data"
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=10)
        try:
            sshfs.wait(timeout=5)
        except subprocess.TimeoutExpired:
            sshfs.kill()
            sshfs.wait()
