"""`--staging overlap` (issue 44): training from run_start while the node-local copy is made.

The same seed trains bitwise the same parameters after every epoch as `--staging inside`, on
one rank and on two real ranks (gloo, torchrun), with staging slowed so that training reads
files before staging reaches them; the overlapped logs pass the official compliance checker
under every HPC ruleset; a source file that fails its checksum, SIGTERM mid-staging and
`--resume` behave as with synchronous staging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from mlhpc.common.vocabulary import RULESETS
from mlhpc.staging import MANIFEST_NAME, build_manifest
from mlhpc.staging.engine import claim_record, claimed, copy_once, demand_copies
from mlhpc.staging.manifest import Manifest
from mlhpc.staging.overlap import NodeCopy
from mlhpc.staging.request import CopyOptions
from tests.helpers.cli import cli_env
from tests.helpers.launchers import torchrun
from tests.helpers.mllog_files import mllog_events, official_compliance

REPO = Path(__file__).resolve().parents[2]
COPY_DELAY_S = "0.05"
"""Per staged file, once training has read one (`slow_staging`): ~2 s for the small dataset."""


def _identity_run(data: Path, out: Path, mode: str, ranks: int) -> dict:
    args = ["-m", "tests.helpers.overlap_identity", str(data), str(out), mode, COPY_DELAY_S]
    if ranks == 1:
        proc = subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env=cli_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)),
        )
    else:
        proc = torchrun(args, REPO, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / f"{mode}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2], ids=["1-rank", "2-ranks"])
def test_training_is_bitwise_the_synchronous_runs(ranks: int, cosmo_data: Path, tmp_path: Path) -> None:
    inside = _identity_run(cosmo_data, tmp_path, "inside", ranks)
    overlap = _identity_run(cosmo_data, tmp_path, "overlap", ranks)
    assert inside["status"] == overlap["status"] == "success"
    assert len(inside["snapshots"]) == 3
    assert overlap["snapshots"] == inside["snapshots"]  # every parameter, after every epoch
    # and it was overlapped: training read files staging had not reached
    figures = overlap["overlap"]
    assert figures["files_read_for_training"] > 0 and figures["overlapped_s"] > 0, figures

    events = mllog_events(tmp_path / "overlap.txt")
    keys = [e["key"] for e in events]
    assert keys.index("run_start") < keys.index("staging_start") < keys.index("epoch_start")
    stop = keys.index("staging_stop")
    assert keys.index("epoch_start") < stop < keys.index("run_stop")
    assert events[stop]["metadata"]["synchronous_staging"] is False
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)  # logged from the staging thread, at its moment

    # every file of the dataset was copied once on the node, by training or by staging
    records = [json.loads(p.read_text()) for p in (tmp_path / "node-overlap" / "claims").iterdir()]
    sources = sorted(fields[3] for fields, _ in records)
    assert sources == sorted(e.path for e in Manifest.read(cosmo_data / MANIFEST_NAME).files)
    assert sum(by == "demand" for _, by in records) == figures["files_read_for_training"]


@pytest.mark.slow
def test_overlapped_logs_pass_the_official_checker_under_every_ruleset(tmp_path: Path) -> None:
    """An overlapped mini campaign run to the target (the checker wants it reached)."""
    proc = _cli(tmp_path, None, "0.002", "--seeds", "1")
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    log = next((tmp_path / "out").rglob("result_0.txt"))
    keys = [e["key"] for e in mllog_events(log)]
    assert keys.index("epoch_start") < keys.index("staging_stop") < keys.index("run_stop")
    for ruleset in RULESETS:
        result = official_compliance(log, ruleset)
        assert result.returncode == 0, ruleset + result.stdout + result.stderr
        assert "SUCCESS" in result.stdout + result.stderr, ruleset


# ---------------------------------------------------------------- once per node, under claims
def _dataset(root: Path, count: int = 12) -> Manifest:
    for i in range(count):
        (root / "train").mkdir(parents=True, exist_ok=True)
        (root / "train" / f"s{i:02d}.bin").write_bytes(os.urandom(3000 + i))
    manifest = build_manifest(root)
    manifest.write(root / MANIFEST_NAME)
    return manifest


def _node(
    tmp_path: Path, count: int = 12, threads: int = 8
) -> tuple[Path, Path, Path, Manifest, CopyOptions]:
    """A source of `count` files, an empty node-local copy and claims folder, and the options of
    an overlapped staging: (src, dest, claims, manifest, options)."""
    src, dest, claims = tmp_path / "src", tmp_path / "dest", tmp_path / "claims"
    manifest = _dataset(src, count)
    dest.mkdir()
    claims.mkdir()
    options = CopyOptions(
        algorithm=manifest.algorithm, run_token="0123456789ab", claims=str(claims), threads=threads
    )
    return src, dest, claims, manifest, options


def test_a_file_claimed_by_many_readers_is_copied_once(tmp_path: Path) -> None:
    src, dest, claims, manifest, options = _node(tmp_path)
    entry = manifest.files[0]
    made: list[bool] = []

    def reader() -> None:
        made.append(copy_once(str(src), str(dest), entry, options, "demand")[1])

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made.count(True) == 1 and len(made) == 8
    assert (dest / entry.path).read_bytes() == (src / entry.path).read_bytes()
    # staging finds it done: the record, not a second read of the source
    staged, copied = copy_once(str(src), str(dest), entry, options, "staging")
    assert not copied and staged.checksum == entry.checksum
    assert demand_copies(str(claims)) == 1
    with claimed(str(claims), entry.path) as fd:
        assert claim_record(fd) is not None


def test_the_loaders_read_the_local_copy_and_nothing_else(tmp_path: Path) -> None:
    src, dest, claims, manifest, options = _node(tmp_path)
    copy = NodeCopy(str(src), str(dest), {e.path: e for e in manifest.files}, options)
    first = manifest.files[3].path
    assert copy.local_path(str(src / first)) == str(dest / first)
    assert (dest / first).read_bytes() == (src / first).read_bytes()
    assert copy.local_path(str(src / "not-listed.bin")) is None  # not a dataset file: read where it is
    assert copy.local_path(str(tmp_path / "elsewhere" / first)) is None
    assert copy.local_path(str(src) + "-sibling/" + first) is None
    assert demand_copies(str(claims)) == 1


def test_a_source_file_that_fails_its_checksum_is_one_line_naming_it(tmp_path: Path) -> None:
    from mlhpc.common.errors import StagingError

    src, dest, _, manifest, options = _node(tmp_path)
    bad = manifest.files[5]
    data = bytearray((src / bad.path).read_bytes())
    data[100] ^= 0xFF
    (src / bad.path).write_bytes(bytes(data))
    copy = NodeCopy(str(src), str(dest), {e.path: e for e in manifest.files}, options)
    with pytest.raises(StagingError) as caught:
        copy.local_path(str(src / bad.path))
    assert bad.path in str(caught.value) and "\n" not in str(caught.value)
    assert not (dest / bad.path).exists()  # nothing under the name a reader would open
    assert list(dest.rglob("*.mlhpc-partial")) == []


# ---------------------------------------------------------------- through the command line
SLOW_RUN = """
import sys
from mlhpc import cli
from tests.helpers.slow_staging import slow_staging

slow_staging(float(sys.argv[1]))
sys.exit(cli.main(sys.argv[2:]))
"""


def _cli(tmp_path: Path, data: Path | None, delay: str, *extra: str) -> subprocess.Popen[str]:
    """`mlhpc run cosmoflow --config mini --staging overlap` with staging slowed; on `data` (the
    small dataset, fixed epochs) or on the mini dataset it generates (to the target)."""
    script = tmp_path / "slow_run.py"
    script.write_text(SLOW_RUN)
    args = ["run", "cosmoflow", "--config", "mini", "--staging", "overlap", "--no-check", "--system", "ci"]
    args += ["--out", str(tmp_path / "out"), "--local-dir", str(tmp_path / "local"), *extra]
    if data is not None:
        args += [
            "--data",
            str(data),
            "data.num_train_samples=32",
            "data.num_eval_samples=8",
            "loop.mode=fixed_epochs",
        ]
    return subprocess.Popen(
        [sys.executable, str(script), delay, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)),
        start_new_session=True,
    )


@pytest.mark.slow
def test_sigterm_mid_staging_is_one_line_and_resume_finishes(tmp_path: Path, cosmo_data: Path) -> None:
    proc = _cli(tmp_path, cosmo_data, "0.5", "--seeds", "1", "loop.max_epochs=3")
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("epoch"):
            break  # training, with staging far from done (0.5 s a file on two threads: ~20 s)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].endswith("--resume"), stderr
    local = tmp_path / "local"
    assert not local.exists() or [p.name for p in local.iterdir() if p.name.startswith("mlhpc-stage")] == []
    resumed = _cli(tmp_path, cosmo_data, "0.02", "--seeds", "1", "--resume", "loop.max_epochs=3")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-2000:] + err[-2000:]
    assert "success after 3 epoch(s)" in out


@pytest.mark.slow
def test_a_corrupt_source_file_stops_the_run_with_one_line(tmp_path: Path, cosmo_data: Path) -> None:
    import shutil

    data = tmp_path / "data"
    shutil.copytree(cosmo_data, data)
    victim = sorted((data / "train").glob("*.npy"))[-1]  # read late by staging, early or late by training
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0xFF
    victim.write_bytes(bytes(raw))
    proc = _cli(tmp_path, data, "0.02", "--seeds", "1", "loop.max_epochs=3")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode != 0, out
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and victim.name in last and "check" in last, err
    assert "success" not in out


# ---------------------------------------------------------------- the order staging follows
class _Files(torch.utils.data.Dataset):
    def __init__(self, n: int, prefix: str) -> None:
        self.n, self.prefix = n, prefix

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index

    def sample_files(self, index: int) -> tuple[Path, ...]:
        return (Path(f"/src/{self.prefix}/d{index}.npy"), Path(f"/src/{self.prefix}/l{index}.npy"))


@pytest.mark.parametrize(
    ("world", "per_node", "n", "seed"), [(1, 1, 37, 3), (4, 2, 50, 11), (6, 3, 61, 20261128)]
)
def test_first_reads_are_what_each_nodes_ranks_read_in_the_first_epoch(world, per_node, n, seed) -> None:
    """The order handed to staging is the one the real loaders read: each rank's sampler of
    epoch 1, its validation shard after, per node."""
    from mlhpc.common.cluster.distributed import DistContext
    from mlhpc.common.training.loaders import torch_data_bundle
    from mlhpc.common.training.loop_config import LoopConfig
    from mlhpc.common.training.staged import first_reads

    loop = LoopConfig(global_batch_size=world * 2, max_epochs=1, target=0.0)
    reads_by_node: dict[int, list[str]] = {}
    order = None
    for rank in range(world):
        ctx = DistContext(
            rank=rank,
            local_rank=rank % per_node,
            world_size=world,
            local_world_size=per_node,
            num_nodes=world // per_node,
            device=torch.device("cpu"),
            backend="gloo",
            launcher="none",
        )
        bundle = torch_data_bundle(
            _Files(n, "train"), _Files(9, "val"), loop=loop, ctx=ctx, seed=seed, num_workers=0, where="/src"
        )
        order = order or first_reads(bundle, ctx)
        assert first_reads(bundle, ctx) == order  # every rank works out the same
        bundle.set_epoch(1)
        mine = [str(p) for i in bundle.train.sampler for p in bundle.train.dataset.sample_files(i)]
        mine += [
            str(p)
            for i in bundle.validation.dataset.indices
            for p in bundle.validation.dataset.dataset.sample_files(i)
        ]
        reads_by_node.setdefault(rank // per_node, []).extend(mine)
    assert order is not None and len(order) == world // per_node
    for node, reads in reads_by_node.items():
        assert sorted(order[node]) == sorted(set(reads))


def test_each_node_sends_first_what_it_reads_first() -> None:
    from mlhpc.staging.manifest import FileEntry
    from mlhpc.staging.plan import plan_exchange

    files = [FileEntry(f"f{i:02d}", 100 + i, "") for i in range(12)]
    first = [["f07", "f03", "f11"], ["f00", "f05"], []]
    exchange = plan_exchange(files, [frozenset()] * 3, first=first)
    streams = [[item.entry.path for item in stream] for stream in exchange.streams]
    assert streams[0][:3] == ["f07", "f03", "f11"] and streams[1][:2] == ["f00", "f05"]
    assert sorted(p for s in streams for p in s) == [f.path for f in files]  # each file sent once


def test_an_overlapped_exchange_stream_reads_ahead_into_the_copy_once(tmp_path: Path) -> None:
    """The exchange's reader under --staging overlap: the stream's bytes are the source's, its
    files are copied into the node-local copy ahead of it, and one training already copied is
    not read from the source again."""
    from mlhpc.staging.exchange import FileStreamReader
    from mlhpc.staging.plan import StreamItem

    src, dest, claims, manifest, options = _node(tmp_path, count=20, threads=3)
    entries = [e for e in manifest.files if e.path.startswith("train/")]
    copy_once(str(src), str(dest), entries[4], options, "demand")  # training was there first
    reader = FileStreamReader([StreamItem(e) for e in entries], str(src), str(dest), options)
    out, view = bytearray(), memoryview(bytearray(4096))
    try:
        while n := reader.fill(0, view):
            out += view[:n]
    finally:
        reader.close()
    assert bytes(out) == b"".join((src / e.path).read_bytes() for e in entries)
    assert all((dest / e.path).read_bytes() == (src / e.path).read_bytes() for e in entries)
    assert reader.read_bytes == sum(e.size for e in entries) - entries[4].size
    assert demand_copies(str(claims)) == 1
