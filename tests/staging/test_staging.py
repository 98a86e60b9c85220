"""Staging on one node: verified copies, resume, the faults a site will meet, the planner, the model."""

from __future__ import annotations

import ctypes
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import xxhash
import zstandard

from mlhpc.common.errors import StagingError
from mlhpc.common.safeio import fileio
from mlhpc.common.safeio.fileio import atomic_write_text, current_umask
from mlhpc.staging import (
    MANIFEST_NAME,
    STAGED_MARKER,
    CallbackComm,
    StageRequest,
    build_manifest,
    stage_dataset,
    verify_staged,
)
from mlhpc.staging import engine as engine_module
from mlhpc.staging import journal as journal_module
from mlhpc.staging.destination import check_free_space, prepare_destination
from mlhpc.staging.engine import SLICE_BYTES, WRITE_SLICE_BYTES, Partial, Staged, copy_file
from mlhpc.staging.exchange import BufferPool
from mlhpc.staging.journal import JOURNAL_BATCH, Journal, close_journal, read_journals
from mlhpc.staging.manifest import FileEntry, Manifest, hash_file
from mlhpc.staging.parallel import run_copies
from mlhpc.staging.plan import CopyOp, Topology, node_files, plan_copies, plan_exchange, rank_files
from mlhpc.staging.request import CopyOptions
from mlhpc.staging.source import RACY_NS
from mlhpc.study.model import Cluster, model_table, staging_time
from tests.helpers.cli import cli_env
from tests.helpers.datasets import dataset_files
from tests.helpers.processes import lock_held_elsewhere


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
    report = stage_dataset(StageRequest(source, dest))
    assert report.files == 7 and report.copied_files == 7 and report.skipped_files == 0
    assert report.bytes == sum(1000 * (i + 1) for i in range(7))
    assert report.read_bytes == report.job_read_bytes == report.bytes
    assert dataset_files(dest) == dataset_files(source)
    assert (dest / STAGED_MARKER).is_file()
    assert not list(dest.rglob("*.mlhpc-partial")) and not list(dest.glob(".mlhpc_journal*"))
    assert verify_staged(dest) == 7
    metadata = report.metadata()
    assert set(metadata) == {
        "staging_duration",
        "staged_files",
        "staged_bytes",
        "staging_io",
        "staging_io_reason",
        "staging_durable",
    }
    assert metadata["staging_io"] == "buffered" and metadata["staging_io_reason"].startswith("auto: ")
    assert metadata["staging_durable"] is False


@pytest.mark.parametrize("io", ["auto", "buffered"])
def test_worker_processes_and_threads_give_the_same_copy(
    source: Path, tmp_path: Path, io: str
) -> None:
    dest = tmp_path / "dest"
    report = stage_dataset(StageRequest(source, dest, processes=2, workers=4, io=io))
    assert report.io is not None and report.io.reason.startswith(f"{io}: through the page cache")
    assert report.copied_files == 7 and dataset_files(dest) == dataset_files(source)
    assert verify_staged(dest) == 7


def test_source_manifest_is_used_and_checked(source: Path, tmp_path: Path) -> None:
    build_manifest(source).write(source / MANIFEST_NAME)
    victim = source / "train" / "f1.bin"
    victim.write_bytes(b"\x09" * victim.stat().st_size)  # same size, other bytes
    with pytest.raises(StagingError, match=r"f1\.bin fails its xxh3_128 check: the source changed"):
        stage_dataset(StageRequest(source, tmp_path / "dest"))
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()
    assert not (tmp_path / "dest" / "train" / "f1.bin").exists()  # never renamed into place


def settle() -> None:
    """Let the source's files age past `RACY_NS`: a copy of a file changed just before records
    no identity, and a rerun copies it again (the rerun tests here count the files kept)."""
    time.sleep(2 * RACY_NS / 1e9)


def test_corrupted_staged_file_is_detected_and_replaced_on_rerun(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    settle()
    stage_dataset(StageRequest(source, dest))
    victim = dest / "validation" / "f2.bin"
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(StagingError, match=r"staged file .*f2\.bin is corrupt"):
        verify_staged(dest)
    report = stage_dataset(StageRequest(source, dest))
    assert (report.copied_files, report.skipped_files) == (1, 6)
    assert verify_staged(dest) == 7


def test_missing_source_file_is_named(source: Path, tmp_path: Path) -> None:
    build_manifest(source).write(source / MANIFEST_NAME)
    (source / "train" / "f3.bin").unlink()
    with pytest.raises(StagingError, match=r"staging source file .*f3\.bin is missing; restore it"):
        stage_dataset(StageRequest(source, tmp_path / "dest"))
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


def test_a_fault_midway_then_a_rerun_completes_it(source: Path, tmp_path: Path) -> None:
    """The copy stops at a missing file; the files copied before it are kept and not copied again."""
    build_manifest(source).write(source / MANIFEST_NAME)
    saved = (source / "validation" / "f6.bin").read_bytes()
    (source / "validation" / "f6.bin").unlink()
    dest = tmp_path / "dest"
    with pytest.raises(StagingError, match=r"f6\.bin is missing"):
        stage_dataset(StageRequest(source, dest, workers=1))
    assert not (dest / STAGED_MARKER).exists()
    (source / "validation" / "f6.bin").write_bytes(saved)
    report = stage_dataset(StageRequest(source, dest, workers=1))
    assert report.copied_files + report.skipped_files == 7 and report.skipped_files >= 1
    assert verify_staged(dest) == 7


KILLED_STAGING = """
import os, signal, sys
from pathlib import Path
from mlhpc.staging import StageRequest, journal, stage_dataset

record = journal.Journal.record_many
count = [0]

def record_then_die(self, staged):
    record(self, staged)
    count[0] += len(staged)
    if count[0] >= int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # an interruption: no cleanup, no exception

journal.Journal.record_many = record_then_die
stage_dataset(StageRequest(Path(sys.argv[1]), Path(sys.argv[2]), workers=2))
"""


def test_resume_after_the_process_was_killed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(40):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"s{i:03d}.npy").write_bytes(os.urandom(5000 + i))
    build_manifest(src).write(src / MANIFEST_NAME)
    dest = tmp_path / "dest"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_STAGING)
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(dest), "15"], env=cli_env(), timeout=120
    )
    assert proc.returncode == -9
    assert not (dest / STAGED_MARKER).exists()
    with pytest.raises(StagingError, match="no complete staged dataset"):
        verify_staged(dest)
    report = stage_dataset(StageRequest(src, dest))
    assert report.skipped_files >= 15 and report.copied_files == 40 - report.skipped_files
    assert verify_staged(dest) == 40 and dataset_files(dest) == dataset_files(src)
    assert not list(dest.rglob("*.mlhpc-partial"))


def test_half_staged_directory_is_not_taken_for_whole(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(source, dest))
    (dest / STAGED_MARKER).unlink()
    with pytest.raises(StagingError, match="no complete staged dataset"):
        verify_staged(dest)


def test_restaging_replaces_a_stale_copy(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    settle()
    stage_dataset(StageRequest(source, dest))
    (dest / "train" / "f1.bin").write_bytes(b"stale")
    report = stage_dataset(StageRequest(source, dest))
    assert (report.copied_files, report.skipped_files) == (1, 6)
    assert verify_staged(dest) == 7


def test_not_enough_space_is_refused_before_copying(source: Path, tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(StagingError, match=rf"needs {free * 2} bytes, \d+ are free"):
        check_free_space(tmp_path / "dest", free * 2)
    manifest = build_manifest(source)
    huge = FileEntry("train/huge.bin", free * 2, "0" * 32)
    Manifest(manifest.algorithm, (*manifest.files, huge)).write(source / MANIFEST_NAME)
    with pytest.raises(StagingError, match=r"not enough space on .*dest: staging needs \d+ bytes"):
        stage_dataset(StageRequest(source, tmp_path / "dest"))
    assert dataset_files(tmp_path / "dest") == {}  # refused before a single file was copied


def test_missing_source_directory(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="is not a directory"):
        stage_dataset(StageRequest(tmp_path / "nope", tmp_path / "dest"))


def test_compressed_files_are_decompressed_while_staging(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    payload = os.urandom(3000) * 20
    (src / "a.npy.gz").write_bytes(gzip.compress(payload))
    (src / "b.npy.zst").write_bytes(zstandard.ZstdCompressor().compress(payload[::-1]))
    (src / "c.txt").write_bytes(b"plain")
    build_manifest(src).write(src / MANIFEST_NAME)
    dest = tmp_path / "dest"
    report = stage_dataset(StageRequest(src, dest, decompress=True))
    assert report.files == 3
    assert (dest / "a.npy").read_bytes() == payload and (dest / "b.npy").read_bytes() == payload[::-1]
    assert (dest / "c.txt").read_bytes() == b"plain"
    assert verify_staged(dest) == 3


def test_two_local_ranks_split_the_work(source: Path, tmp_path: Path) -> None:
    """Two ranks of one node, run one after the other with a no-op barrier, build one complete copy."""
    dest = tmp_path / "dest"
    first = stage_dataset(StageRequest(source, dest), CallbackComm(local_rank=1, local_size=2))
    assert not (dest / STAGED_MARKER).exists()  # only local rank 0 marks the copy complete
    stage_dataset(StageRequest(source, dest), CallbackComm(local_rank=0, local_size=2))
    assert first.files == 7
    assert verify_staged(dest) == 7


def test_sha256_on_request(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    assert hash_file(path, "sha256") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"abc")
    build_manifest(src, "sha256").write(src / MANIFEST_NAME)
    stage_dataset(StageRequest(src, tmp_path / "dest"))
    assert json.loads((tmp_path / "dest" / MANIFEST_NAME).read_text())["algorithm"] == "sha256"
    assert verify_staged(tmp_path / "dest") == 1


def manifest_of(sizes: list[int]) -> Manifest:
    return Manifest("xxh3_128", tuple(FileEntry(f"f{i}", size, "x") for i, size in enumerate(sizes)))


def plan_node_copies(manifest: Manifest, local_rank: int, local_size: int) -> list[CopyOp]:
    """One node, `local_size` ranks: the copies of `local_rank` (balanced by bytes)."""
    topo = Topology(node=0, num_nodes=1, local_rank=local_rank, local_size=local_size)
    return plan_copies(rank_files(manifest, "copy", topo), frozenset())


def test_planner_splits_every_file_once_and_balances_bytes() -> None:
    manifest = manifest_of([9, 7, 5, 3, 1, 1])
    shares = [plan_node_copies(manifest, rank, 3) for rank in range(3)]
    paths = [op.entry.path for share in shares for op in share]
    assert sorted(paths) == sorted(f.path for f in manifest.files)
    loads = [sum(op.entry.size for op in share) for share in shares]
    assert max(loads) - min(loads) <= 2
    with pytest.raises(ValueError):
        plan_node_copies(manifest, 3, 3)


def test_shard_gives_each_node_its_own_part_and_replicate_all() -> None:
    manifest = manifest_of([50, 40, 30, 20, 10, 10, 5, 5])
    shards = [
        node_files(manifest, "shard", Topology(node=n, num_nodes=3, local_rank=0, local_size=1))
        for n in range(3)
    ]
    assert sorted(f.path for s in shards for f in s) == sorted(f.path for f in manifest.files)
    assert max(sum(f.size for f in s) for s in shards) <= 60
    every = node_files(manifest, "replicate", Topology(node=2, num_nodes=3, local_rank=0, local_size=1))
    assert len(every) == 8


def test_exchange_reads_each_file_once_and_skips_what_nodes_hold() -> None:
    manifest = manifest_of([8, 7, 6, 5, 4, 3, 2, 1, 0])
    topo = Topology(node=0, num_nodes=3, local_rank=1, local_size=2)
    group = rank_files(manifest, "replicate", topo)
    exchange = plan_exchange(group, [frozenset()] * 3)
    sent = [i.entry.path for stream in exchange.streams for i in stream]
    assert sorted(sent) == sorted(f.path for f in group)  # each file sent by exactly one node
    assert not any(i.from_dest for stream in exchange.streams for i in stream)
    held = frozenset(f.path for f in group[:2])
    resumed = plan_exchange(group, [held, held, held | {group[2].path}])
    items = {i.entry.path: (n, i.from_dest) for n, stream in enumerate(resumed.streams) for i in stream}
    assert not set(items) & held  # every node holds them: nothing to send
    assert items[group[2].path] == (2, True)  # sent from the node that holds it, not re-read


def test_paper_model_shapes() -> None:
    cluster = Cluster()
    copy = [staging_time(5e12, n, "copy", cluster).seconds for n in (1, 64, 1024)]
    replicate = [staging_time(5e12, n, "replicate", cluster).seconds for n in (1, 64, 1024)]
    shard = [staging_time(5e12, n, "shard", cluster).seconds for n in (1, 64, 1024)]
    assert copy[0] < copy[1] < copy[2]  # the shared file system is read N times
    assert max(replicate) <= 1.1 * replicate[1]  # flat: bounded per node, not by N
    assert shard[0] > shard[1] >= shard[2]
    assert staging_time(8.8e12, 1, "replicate", cluster).fits is False
    assert "does not fit" in model_table(cluster) and "DeepCAM" in model_table(cluster)


def _evicted(path: Path) -> None:
    """`path` on disk and out of the page cache (its pages are clean, so the kernel drops them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("workers", [1, 8])
def test_large_files_read_in_slices_give_the_same_copy(tmp_path: Path, workers: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):  # three 16 MiB blocks each, the last one short and not a whole page
        (src / f"big{i}.npy").write_bytes(os.urandom((40 << 20) + 123 + i))
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(src, dest, workers=workers))
    for i in range(2):
        assert (dest / f"big{i}.npy").read_bytes() == (src / f"big{i}.npy").read_bytes()
    assert verify_staged(dest) == 2


@pytest.mark.parametrize("piece", [1, 4095, WRITE_SLICE_BYTES + 1, SLICE_BYTES * 3])
def test_pieces_of_any_size_give_the_same_file_and_checksum(tmp_path: Path, piece: int) -> None:
    data = os.urandom(2 * SLICE_BYTES + WRITE_SLICE_BYTES + 123)  # the last piece short, not a whole page
    entry = FileEntry("big.bin", len(data), xxhash.xxh3_128(data).hexdigest())
    partial = Partial(str(tmp_path), entry, CopyOptions())
    for at in range(0, len(data), piece):
        partial.write(data[at : at + piece])
    assert partial.finish().checksum == entry.checksum
    assert (tmp_path / "big.bin").read_bytes() == data


def test_a_source_that_shrank_to_a_block_boundary_is_named_not_a_crash(tmp_path: Path) -> None:
    entry = FileEntry("big.bin", 32 << 20, "")
    partial = Partial(str(tmp_path), entry, CopyOptions())
    partial.write(bytes(16 << 20))
    partial.write(b"")  # what a read that finds the end hands on
    with pytest.raises(StagingError, match=r"big\.bin gave 16777216 bytes.*source changed"):
        partial.finish()
    assert list(tmp_path.iterdir()) == []  # the partial file is gone


@pytest.mark.parametrize("listed", [4095, 4097, SLICE_BYTES + 1])
def test_a_file_whose_size_is_not_its_listing_is_named(tmp_path: Path, listed: int) -> None:
    """Small files are read whole with no `fstat`: their one read must still catch a file that
    shrank or grew since it was listed, as `fstat` does for large ones."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(os.urandom(4096 if listed < SLICE_BYTES else SLICE_BYTES))
    src_root, dest_root = str(tmp_path / "src"), str(tmp_path / "dest")
    with pytest.raises(
        StagingError, match=rf"f\.bin (has|gave) \d+ bytes, its listing says {listed}.*regenerate"
    ):
        copy_file(src_root, dest_root, FileEntry("f.bin", listed, ""), CopyOptions())
    close_journal(dest_root)
    assert not list((tmp_path / "dest").rglob("*.bin*"))  # no partial, nothing renamed into place


def test_a_small_file_costs_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    data = os.urandom(5000)
    (tmp_path / "src" / "f.bin").write_bytes(data)
    reads: list[int] = []
    real_readv = os.readv
    monkeypatch.setattr(os, "readv", lambda fd, buffers: reads.append(fd) or real_readv(fd, buffers))
    entry = FileEntry("f.bin", len(data), xxhash.xxh3_128(data).hexdigest())
    staged = copy_file(str(tmp_path / "src"), str(tmp_path / "dest"), entry, CopyOptions())
    close_journal(str(tmp_path / "dest"))
    assert len(reads) == 1  # the short read that brings the listed size is the end: no read for EOF
    assert (tmp_path / "dest" / "f.bin").read_bytes() == data and staged.size == len(data)


def test_journal_appends_in_batches_and_on_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "JOURNAL_DELAY_S", 3600.0)  # a slow machine must not flush early
    journal = Journal(str(tmp_path))

    def lines() -> list[str]:
        return Path(journal.path).read_text().splitlines()

    staged = [Staged(f"f{i}", i, "c", f"f{i}", "") for i in range(JOURNAL_BATCH + 3)]
    for record in staged[: JOURNAL_BATCH - 1]:
        journal.record(record)
    assert lines() == []  # held until a batch is full
    journal.record(staged[JOURNAL_BATCH - 1])
    assert len(lines()) == JOURNAL_BATCH
    for record in staged[JOURNAL_BATCH:]:
        journal.record(record)
    journal.close()  # writes the rest
    assert [json.loads(line)[0] for line in lines()] == [s.path for s in staged]
    assert set(read_journals(tmp_path)) == {s.source for s in staged}


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux's /proc/self/maps")
def test_copy_buffers_are_private_memory_not_shmem() -> None:
    buffer = BufferPool().get(16 << 20)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start <= address < end:
            mode, backing = line.split()[1], line.split()[5:]
            break
    else:
        pytest.fail("the buffer is in no mapping of /proc/self/maps")
    assert mode.endswith("p") and not backing  # not 'rw-s /dev/zero (deleted)': shmem, dearer to fault in


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_a_memory_destination_gets_the_same_copy(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.npy").write_bytes(os.urandom(3 * SLICE_BYTES + 5))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        stage_dataset(StageRequest(src, Path(shm) / "dest", workers=8))
        assert (Path(shm) / "dest" / "big.npy").read_bytes() == (src / "big.npy").read_bytes()
        assert verify_staged(Path(shm) / "dest") == 1





def test_a_copy_made_by_another_tool_is_verified_and_kept(source: Path, tmp_path: Path) -> None:
    build_manifest(source).write(source / MANIFEST_NAME)
    dest = tmp_path / "dest"
    shutil.copytree(source, dest)
    (dest / MANIFEST_NAME).unlink()  # no journal, no manifest: only the source's checksums
    report = stage_dataset(StageRequest(source, dest))
    assert (report.copied_files, report.skipped_files, report.files) == (0, 7, 7)
    assert verify_staged(dest) == 7


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set this process's umask for the test (worker processes inherit it); restored after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def private_source(root: Path) -> Path:
    """A source with a private folder, a setuid file, a read-only file and a read-only folder."""
    for folder, mode in (("private", 0o700), ("public", 0o755), ("frozen", 0o555)):
        (root / folder).mkdir(parents=True)
        (root / folder / "f.bin").write_bytes(folder.encode() * 100)
        (root / folder).chmod(mode)
    (root / "private" / "f.bin").chmod(0o600)
    (root / "public" / "f.bin").chmod(0o644)
    (root / "run.sh").write_bytes(b"#!/bin/sh\n")
    (root / "run.sh").chmod(0o4755)
    (root / "notes.txt").write_bytes(b"read me")
    (root / "notes.txt").chmod(0o444)
    root.chmod(0o750)
    return root


@pytest.mark.parametrize(("mask", "processes"), [(0o022, 1), (0o077, 1), (0o077, 2), (0o002, 2)])
def test_staged_copies_keep_the_source_modes_whatever_the_umask(
    tmp_path: Path, umask: Callable[[int], None], mask: int, processes: int
) -> None:
    src = private_source(tmp_path / "src")
    dest = tmp_path / "dest"
    umask(mask)
    settle()
    stage_dataset(StageRequest(src, dest, processes=processes, workers=2))
    modes = {p: (dest / p).stat().st_mode & 0o7777 for p in ("private", "public", "frozen")}
    assert modes == {"private": 0o700, "public": 0o755, "frozen": 0o755}  # a rerun must write there
    files = ("private/f.bin", "public/f.bin", "frozen/f.bin", "run.sh", "notes.txt")
    modes = {p: (dest / p).stat().st_mode & 0o7777 for p in files}
    assert modes == {
        "private/f.bin": 0o600,
        "public/f.bin": 0o644,
        "frozen/f.bin": 0o644,
        "run.sh": 0o755,  # no setuid bit on a copy
        "notes.txt": 0o444,
    }
    assert dest.stat().st_mode & 0o7777 == 0o750  # made by staging: the source's bits
    for written in (MANIFEST_NAME, STAGED_MARKER):  # for others to read: the umask decides
        assert (dest / written).stat().st_mode & 0o777 == 0o666 & ~mask
    assert verify_staged(dest) == 5
    report = stage_dataset(
        StageRequest(src, dest, processes=processes, workers=2)
    )  # a rerun over 0o444 files
    assert report.skipped_files == 5


def test_an_existing_destination_keeps_its_own_mode(tmp_path: Path) -> None:
    src = private_source(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o711)
    dest.chmod(0o711)
    stage_dataset(StageRequest(src, dest))
    assert dest.stat().st_mode & 0o777 == 0o711  # staging chose neither the folder nor its mode


@pytest.mark.parametrize("source_mode", [0o600, 0o4755, 0o2750, 0o1777])
def test_file_sink_keeps_the_mode_without_special_bits(
    tmp_path: Path, umask: Callable[[int], None], source_mode: int
) -> None:
    umask(0o077)  # would take the group's and others' bits
    data = b"x" * 1000
    entry = FileEntry("a/b.bin", len(data), xxhash.xxh3_128(data).hexdigest())
    partial = Partial(str(tmp_path), entry, CopyOptions(umask=0o077), mode=source_mode)
    partial.write(data)
    partial.finish()
    assert (tmp_path / "a" / "b.bin").stat().st_mode & 0o7777 == source_mode & 0o777


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_atomic_writes_follow_the_umask(tmp_path: Path, umask: Callable[[int], None], mask: int) -> None:
    umask(mask)
    assert current_umask() == mask
    atomic_write_text(tmp_path / "systems.json", "{}\n")
    assert (tmp_path / "systems.json").stat().st_mode & 0o777 == 0o666 & ~mask
    assert not [p for p in tmp_path.iterdir() if p.name != "systems.json"]  # no temporary left


def test_umask_without_proc_falls_back_and_leaves_it_unchanged(
    umask: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    umask(0o027)

    def no_proc(*args: object, **kwargs: object) -> None:
        raise OSError("no /proc here")

    monkeypatch.setattr(fileio, "open", no_proc, raising=False)
    assert current_umask() == 0o027
    monkeypatch.undo()
    assert current_umask() == 0o027


def test_archive_members_keep_their_modes_without_special_bits(tmp_path: Path) -> None:
    archive = tmp_path / "modes.tar"
    with tarfile.open(archive, "w") as tar:
        for name, mode in (("secret.bin", 0o600), ("tool", 0o4755), ("open.bin", 0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = 3, mode
            tar.addfile(info, io.BytesIO(b"abc"))
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(archive, dest))
    modes = {p: (dest / p).stat().st_mode & 0o7777 for p in ("secret.bin", "tool", "open.bin")}
    assert modes == {"secret.bin": 0o600, "tool": 0o755, "open.bin": 0o644}


def test_a_destination_another_process_holds_is_refused_before_any_work(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    with lock_held_elsewhere(dest) as holder:
        with pytest.raises(StagingError, match=rf"{dest} is in use by pid {holder} on .*a test's hold"):
            stage_dataset(StageRequest(source, dest))
        assert [p.name for p in dest.iterdir()] == [".mlhpc.lock"]
    report = stage_dataset(StageRequest(source, dest))  # the holder is gone: its lock with it
    assert report.copied_files == 7 and verify_staged(dest) == 7


def test_a_destination_with_only_a_lock_file_is_fresh(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ".mlhpc.lock").write_text("{}\n")
    assert prepare_destination(dest, 0, "0123456789ab")
    (dest / "x").write_text("")
    assert not prepare_destination(dest, 0, "0123456789ab")


@pytest.mark.parametrize(
    ("knobs", "line"),
    [
        ({"workers": 0}, "workers=0 must be a whole number of at least 1; pass 1 or more threads"),
        ({"workers": True}, "workers=True must be a whole number of at least 1"),
        ({"workers": "8"}, "workers='8' must be a whole number of at least 1"),
        ({"chunk_bytes": 0}, "chunk_bytes=0 must be a whole number of at least 1; pass 1 or more bytes"),
        ({"processes": -1}, "processes=-1 must be a whole number of at least 0; pass 0 or None"),
        ({"processes": 2.5}, "processes=2.5 must be a whole number of at least 0"),
        ({"mode": "mirror"}, "mode='mirror' is unknown; use one of replicate, shard, copy"),
        ({"io": "fast"}, "io='fast' is unknown; use one of auto, buffered"),
    ],
)
def test_a_bad_request_is_refused_naming_field_value_and_fix(
    source: Path, tmp_path: Path, knobs: dict[str, object], line: str
) -> None:
    with pytest.raises(StagingError, match=re.escape(line)):
        StageRequest(source, tmp_path / "dest", **knobs)  # type: ignore[arg-type]
    assert not (tmp_path / "dest").exists()


def test_a_request_takes_str_paths_and_cannot_change(source: Path, tmp_path: Path) -> None:
    request = StageRequest(str(source), str(tmp_path / "dest"), workers=2)
    assert (request.src, request.dest) == (source, tmp_path / "dest")
    with pytest.raises(AttributeError):
        request.workers = 3  # type: ignore[misc]
    assert stage_dataset(request).files == 7


def test_an_interrupted_copy_stops_its_large_files_at_the_next_block(tmp_path: Path) -> None:
    """Ctrl-C (here from the progress callback) stops the copies under way at their next block and
    removes their partial files, instead of finishing gigabytes first."""
    src = tmp_path / "src"
    src.mkdir()
    entries = [FileEntry("small.bin", 10, xxhash.xxh3_128(b"s" * 10).hexdigest())]
    (src / "small.bin").write_bytes(b"s" * 10)
    for i in range(2):
        data = os.urandom(1 << 20) * 48
        (src / f"big{i}.bin").write_bytes(data)
        entries.append(FileEntry(f"big{i}.bin", len(data), xxhash.xxh3_128(data).hexdigest()))
    src_root, dest_root, options = str(src), str(tmp_path / "dest"), CopyOptions(threads=3)

    def interrupt(staged: list) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_copies(entries, src_root, dest_root, options, on_done=interrupt)
    assert not list((tmp_path / "dest").rglob("*.mlhpc-partial"))
    assert not (tmp_path / "dest" / "big0.bin").exists() and not (tmp_path / "dest" / "big1.bin").exists()
    assert not engine_module._stopping  # the next staging into it is not stopped
    assert len(run_copies(entries, src_root, dest_root, options)) == 3
