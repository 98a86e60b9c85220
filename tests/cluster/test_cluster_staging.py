"""`srun -N 4 mlhpc stage` across the hosts of the session's virtual cluster (scripts/vcluster):
each node's own /local ends with exactly what the mode says, verified there with `mlhpc verify`;
replicate reads the shared source once in total across the nodes, copy once per node (measured).

How reads are counted: every stage process runs under `strace -f -ff -y`, which logs each read
syscall with the path of its file and the bytes it returned (read, pread64, readv, preadv,
preadv2, copy_file_range, splice, sendfile); a read-only mmap of a source file counts its whole
length unless the mapping is only probed with mincore (staging's page-cache check) and unmapped.
Not /proc/<pid>/io: its rchar also counts the gloo exchange's socket reads and Python's imports,
and read_bytes misses what the page cache, one for every "node" here, already holds.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlhpc.staging.manifest import Manifest
from mlhpc.staging.plan import balance
from tests.helpers.vcluster_fixture import NODES, VCluster

pytestmark = pytest.mark.cluster

SIZES = [300_000, 1_200_000, 50_000, 700_000, 2_000_000, 128_000, 900_000, 64_000, 1_500_000, 10_000, 400_000]
STAGING_FILES = {"mlhpc_manifest.json", ".mlhpc.lock", ".mlhpc_sources.jsonl", ".mlhpc_staged.json"}
TRACED = "read,pread64,readv,preadv,preadv2,copy_file_range,splice,sendfile,mmap,mincore,munmap"
READ = re.compile(
    r"^(?:read|pread64|readv|preadv|preadv2|copy_file_range|splice)\(\d+<([^>]*)>.*\)\s+=\s+(\d+)$"
)
SENDFILE = re.compile(r"^sendfile\(\d+<[^>]*>, \d+<([^>]*)>.*\)\s+=\s+(\d+)$")
MMAP = re.compile(r"^mmap\([^,]+, (\d+), [^,]+, [^,]+, \d+<([^>]*)>.*\)\s+=\s+(0x[0-9a-f]+)$")


@pytest.fixture(scope="module")
def dataset(vcluster: VCluster) -> Iterator[Path]:
    """12 files (7.6 MB, one in a subfolder) with their manifest, on the shared file system."""
    root = vcluster.shared / f"data-{uuid.uuid4().hex[:8]}"
    (root / "sub").mkdir(parents=True)
    for i, size in enumerate(SIZES):
        (root / f"f{i:02d}.bin").write_bytes(os.urandom(size))
    (root / "sub" / "g.bin").write_bytes(os.urandom(333_333))
    subprocess.run([Path(sys.executable).parent / "mlhpc", "manifest", root], check=True, capture_output=True)
    yield root
    shutil.rmtree(root)


@pytest.fixture
def traces(vcluster: VCluster) -> Iterator[Path]:
    """A folder for the nodes' strace logs, on the shared file system."""
    folder = vcluster.shared / f"traces-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def dest(vcluster: VCluster) -> Iterator[str]:
    """A fresh /local/<name> on every node, removed after the test."""
    name = f"stage-{uuid.uuid4().hex[:8]}"
    yield f"/local/{name}"
    for node in vcluster.nodes:
        shutil.rmtree(vcluster.local_dir(node) / name, ignore_errors=True)


def data_files(root: Path) -> dict[str, bytes]:
    """The dataset files under `root` (not staging's own bookkeeping), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name not in STAGING_FILES and ".mlhpc_staging" not in p.parts
    }


def stage(vcluster: VCluster, src: Path, dest: str, mode: str, traces: Path | None = None) -> str:
    """`srun -N 4 mlhpc stage SRC DEST --mode MODE`, then `mlhpc verify DEST` on each node;
    with `traces`, each node's stage processes run under strace (files traces/<host>.<pid>)."""
    tracer = (
        f"strace -f -ff --seccomp-bpf -qq -y -s 0 -e trace={TRACED} -o {traces}/$(hostname) "
        if traces
        else ""
    )
    script = f"{tracer}mlhpc stage {src} {dest} --mode {mode} && mlhpc verify {dest}"
    out = vcluster.exec(
        "login", ["srun", "-N", str(NODES), "--ntasks-per-node=1", "sh", "-c", script], timeout=300
    )
    assert out.stdout.count("files verified") == NODES, out.stdout
    return out.stdout


def source_reads(traces: Path, src: Path) -> dict[str, collections.Counter[str]]:
    """Bytes each node's stage processes read from each file under `src` (see the module note)."""
    reads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    prefix = f"{src}/"
    for trace in traces.iterdir():
        host, pending = trace.name.split(".")[0], None
        for line in trace.read_text(errors="replace").splitlines():
            if (
                pending is not None
            ):  # an mmap of a source file: only a mincore probe if unmapped right after one
                addr, length, path, probed = pending
                if line.startswith(f"mincore({addr},"):
                    pending = (addr, length, path, True)
                    continue
                if not (probed and line.startswith(f"munmap({addr},")):
                    reads[host][path] += length
                pending = None
                continue
            if (match := READ.match(line)) or (match := SENDFILE.match(line)):
                reads[host][match.group(1)] += int(match.group(2))
            elif match := MMAP.match(line):
                pending = (match.group(3), int(match.group(1)), match.group(2), False)
        if pending is not None:
            reads[host][pending[2]] += pending[1]
    return {
        host: collections.Counter({p[len(prefix) :]: n for p, n in counts.items() if p.startswith(prefix)})
        for host, counts in reads.items()
    }


def reads_per_file(reads: dict[str, collections.Counter[str]]) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for counts in reads.values():
        total.update(counts)
    return total


def needs_strace() -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace not found (apt-get install strace): it measures what each node reads")


def test_replicate_gives_every_node_all_files_reading_the_source_once(
    vcluster: VCluster, dataset: Path, dest: str, traces: Path
) -> None:
    needs_strace()
    stage(vcluster, dataset, dest, "replicate", traces=traces)
    expected = data_files(dataset)
    for node in vcluster.nodes:
        assert data_files(vcluster.local_dir(node) / Path(dest).name) == expected, node
    reads = source_reads(traces, dataset)
    assert set(reads) == set(vcluster.nodes)  # every node's process was traced
    per_file = reads_per_file(reads)
    # each data file was read once in total, by one node, and sent to the others over the network
    assert {p: per_file[p] for p in expected} == {p: len(b) for p, b in expected.items()}, dict(reads)
    assert (
        sum(per_file.values()) - sum(map(len, expected.values()))
        <= (dataset / "mlhpc_manifest.json").stat().st_size
    )


def test_copy_reads_the_source_once_per_node(
    vcluster: VCluster, dataset: Path, dest: str, traces: Path
) -> None:
    """The control of the measurement above: every node reads every file itself."""
    needs_strace()
    stage(vcluster, dataset, dest, "copy", traces=traces)
    expected = data_files(dataset)
    for node in vcluster.nodes:
        assert data_files(vcluster.local_dir(node) / Path(dest).name) == expected, node
    reads = source_reads(traces, dataset)
    for node in vcluster.nodes:
        assert {p: reads[node][p] for p in expected} == {p: len(b) for p, b in expected.items()}, node


def test_shard_splits_the_files_as_the_plan_says(vcluster: VCluster, dataset: Path, dest: str) -> None:
    stage(vcluster, dataset, dest, "shard")
    expected = data_files(dataset)
    shares = balance(Manifest.read(dataset / "mlhpc_manifest.json").files, NODES)
    held: dict[str, dict[str, bytes]] = {}
    indices = []
    for node in vcluster.nodes:
        folder = vcluster.local_dir(node) / Path(dest).name
        marker = json.loads((folder / ".mlhpc_staged.json").read_text())
        assert (marker["mode"], marker["nodes"]) == ("shard", NODES)
        indices.append(marker["node"])
        held[node] = data_files(folder)
        assert sorted(held[node]) == sorted(f.path for f in shares[marker["node"]]), node
        assert all(expected[p] == b for p, b in held[node].items()), node
    assert sorted(indices) == list(range(NODES))
    everything = [p for files in held.values() for p in files]
    assert sorted(everything) == sorted(expected)  # the union is the whole set, and disjoint
