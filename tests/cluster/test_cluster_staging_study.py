"""perf/cluster_staging.py: the model of staging time against node count, the crossover
arithmetic, the report built from measured rows, and (marker `cluster`) the whole study on a
tiny 2-node cluster with its storage node: up, measure, report, down."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mlhpc.study import model as vm  # the model on the virtual cluster
from tests.helpers.cli import cli_env
from tests.helpers.vcluster_fixture import vcluster_missing

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "perf"))

import cluster_staging_cluster as csc  # noqa: E402
import cluster_staging_measure as csm  # noqa: E402
import cluster_staging_report as csr  # noqa: E402

MIB = 1 << 20
HEADER = 4096
STUDY = vm.Setup(link_bit_s=50e6, fs_bit_s=150e6)
"""The study's setup: 50 Mbit/s node links, a 150 Mbit/s shared file system."""
SIZES = [2 * MIB] * 64
"""The study's dataset: 128 MiB in 2 MiB files."""


def test_rates_are_tc_rates_less_the_frame_headers() -> None:
    assert csc.bits_per_s("50mbit") == 50e6
    assert csc.bits_per_s("1.5gbit") == 1.5e9
    assert STUDY.link_bytes_s == pytest.approx(50e6 / 8 * 1448 / 1514)
    with pytest.raises(csc.StudyError, match="50mbit"):
        csc.bits_per_s("50 MB/s")


def test_copy_is_link_bound_until_the_nodes_outrun_the_shared_file_system() -> None:
    total = sum(SIZES)
    link, fs = STUDY.link_bytes_s, STUDY.fs_bytes_s
    for n in (1, 2, 3):  # 3 x 50 Mbit/s fit in 150 Mbit/s: each node's own link sets the pace
        assert vm.model_seconds("copy", n, SIZES, STUDY) == pytest.approx(total / link)
    for n in (4, 6, 8):  # then N x S through the shared file system
        assert vm.model_seconds("copy", n, SIZES, STUDY) == pytest.approx(n * total / fs)


def test_shard_reads_each_nodes_share_once() -> None:
    total = sum(SIZES)
    assert vm.model_seconds("shard", 2, SIZES, STUDY) == pytest.approx(total / 2 / STUDY.link_bytes_s)
    # 8 nodes read 16 MiB each, 128 MiB in all through the 150 Mbit/s file system
    assert vm.model_seconds("shard", 8, SIZES, STUDY) == pytest.approx(total / STUDY.fs_bytes_s)
    # an uneven split: the largest share sets the time (3 files of 5, 3, 3 MiB on 2 nodes)
    assert vm.model_seconds("shard", 2, [5 * MIB, 3 * MIB, 3 * MIB], STUDY) == pytest.approx(
        max(11 * MIB / STUDY.fs_bytes_s, 6 * MIB / STUDY.link_bytes_s)
    )


def test_replicate_moves_whole_padded_chunks_round_by_round() -> None:
    link, fs = STUDY.link_bytes_s, STUDY.fs_bytes_s
    chunk = 16 * MIB + HEADER
    # 8 nodes: 16 MiB each, one round; the ring brings 7 chunks into each node
    assert vm.model_seconds("replicate", 8, SIZES, STUDY) == pytest.approx(128 * MIB / fs + 7 * chunk / link)
    # 2 nodes: 64 MiB each, four rounds of one chunk from the other node
    assert vm.model_seconds("replicate", 2, SIZES, STUDY) == pytest.approx(64 * MIB / link + 4 * chunk / link)
    # 6 nodes: shares of 22 and 20 MiB take two rounds, the second padded to a whole chunk
    assert vm.model_seconds("replicate", 6, SIZES, STUDY) == pytest.approx(
        max(128 * MIB / fs, 22 * MIB / link) + 2 * 5 * chunk / link
    )
    # the all-gather's own measured rate replaces the link's where it is known
    slow = vm.Setup(link_bit_s=50e6, fs_bit_s=150e6, allgather_bytes_s=((2, 1e6),))
    assert vm.model_seconds("replicate", 2, SIZES, slow) == pytest.approx(64 * MIB / link + 4 * chunk / 1e6)
    assert vm.model_seconds("replicate", 8, SIZES, slow) == vm.model_seconds("replicate", 8, SIZES, STUDY)
    # one node exchanges nothing: it copies
    assert vm.model_seconds("replicate", 1, SIZES, STUDY) == vm.model_seconds("copy", 1, SIZES, STUDY)
    with pytest.raises(ValueError, match="mode='mirror'"):
        vm.model_seconds("mirror", 2, SIZES, STUDY)


def test_crossover_interpolates_where_copy_becomes_slower_for_good() -> None:
    assert vm.crossover([2, 4], [10.0, 30.0], [20.0, 20.0]) == pytest.approx(3.0)
    # a crossing back and forth: the last one counts
    assert vm.crossover([1, 2, 4, 8], [10, 12, 11, 40], [10, 11, 12, 20]) == pytest.approx(4 + 4 * 1 / 21)
    assert vm.crossover([1, 2], [5.0, 6.0], [5.0, 9.0]) is None  # copy never slower
    assert vm.crossover([2, 4], [9.0, 30.0], [5.0, 20.0]) == 2.0  # slower from the first count
    assert vm.crossover([], [], []) is None


def test_the_study_setup_puts_the_crossover_between_three_and_four_nodes() -> None:
    """With 3 x 50 Mbit/s = the file system's 150 Mbit/s, copy turns file-system bound at 3
    nodes; replicate's padded rounds cost it a little more than the link alone."""
    predicted = vm.model_crossover(SIZES, STUDY, largest=8)
    assert predicted is not None and 3 < predicted < 4
    # twice as fast a shared file system moves the crossover to about twice the nodes
    doubled = vm.model_crossover(SIZES, vm.Setup(link_bit_s=50e6, fs_bit_s=300e6), largest=16)
    assert doubled is not None and 6 < doubled < 8


def rows(points: dict[tuple[int, str], list[float]]) -> list[dict]:
    out = []
    for (n, mode), seconds in points.items():
        for r, s in enumerate(seconds):
            row = dict.fromkeys(csm.COLUMNS, "0")
            row.update(nodes=str(n), mode=mode, repeat=str(r), stage_s=str(s), link="50mbit", fs="150mbit")
            out.append(row)
    return out


def test_the_report_puts_the_model_beside_each_median_and_finds_both_crossovers() -> None:
    measured = {
        (2, "copy"): [22.0, 23.0, 30.0],
        (2, "replicate"): [27.0, 28.0, 29.0],
        (4, "copy"): [30.0, 31.0, 29.0],
        (4, "replicate"): [26.0, 25.0, 27.0],
        (4, "shard"): [8.0, 7.0, 9.0],
        (1, "tiny"): [0.05, 0.03, 0.04],
    }
    setup = csr.setup_from_rows(rows(measured))
    assert setup.overhead_s == pytest.approx(0.04) and setup.link_bit_s == 50e6
    found = csr.report(rows(measured), SIZES, setup)
    table = found.table

    def model(mode: str, n: int) -> str:
        return f"{vm.model_seconds(mode, n, SIZES, setup):.1f}"

    replicate = f"28.0 (27.0-29.0) | {model('replicate', 2)} | {model('replicate', 2)}"
    assert f"| 2 | 23.0 (22.0-30.0) | {model('copy', 2)} | {replicate} | - | {model('shard', 2)} |" in table
    assert f"| 4 | 30.0 (29.0-31.0) | {model('copy', 4)} |" in table
    assert f"8.0 (7.0-9.0) | {model('shard', 4)} |" in table
    # copy - replicate: -5 at 2 nodes, +4 at 4 nodes
    assert found.measured == pytest.approx(2 + 2 * 5 / 9)
    assert found.predicted == pytest.approx(vm.model_crossover(SIZES, setup, largest=4))
    assert found.predicted_gather == found.predicted  # no all-gather measured: the link's rate
    # an all-gather measured alone on 4 nodes at a third of the link: replicate's model, slower
    # there than copy, crosses no more within 4 nodes
    gathers = [
        {**rows({(4, "allgather"): [s]})[0], "dataset_bytes": str(16 * MIB + HEADER)}
        for s in (9.0, 8.0, 30.0)
    ]
    slow = csr.setup_from_rows(rows(measured) + gathers)
    assert slow.allgather_bytes_s == ((4, (16 * MIB + HEADER) / 9.0),)
    assert csr.report(rows(measured), SIZES, slow).predicted_gather is None
    with pytest.raises(csc.StudyError, match="mixes"):
        csr.setup_from_rows([*rows(measured), {**rows(measured)[0], "link": "100mbit"}])


def test_the_model_command_prints_the_table_and_the_crossover() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "perf" / "cluster_staging.py"), "model", "--nodes", "1,8"],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=True,
    )
    assert "| 8 | 59.9 | 27.1 | 7.5 |" in proc.stdout
    assert "crossover copy/replicate: 3.2" in proc.stdout


@pytest.mark.cluster
def test_the_study_runs_end_to_end_on_two_nodes_and_leaves_nothing(tmp_path: Path) -> None:
    """up (2 nodes and the storage node, 8 MiB), every mode once, the report, down."""
    if reason := vcluster_missing():
        pytest.skip(reason)
    for tool in ("sshfs", "fusermount3", "/usr/sbin/sshd"):
        if shutil.which(tool) is None:
            pytest.skip(
                f"{tool} not found (apt-get install openssh-server sshfs): the storage node serves sshfs"
            )
    name = f"cs{uuid.uuid4().hex[:6]}"
    script = [sys.executable, str(REPO / "perf" / "cluster_staging.py")]
    env = cli_env()

    def study(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*script, *args, "--name", name], capture_output=True, text=True, env=env, timeout=400
        )

    up = study(
        "up", "--nodes", "2", "--link", "400mbit", "--fs", "400mbit", "--total-mib", "8", "--file-mib", "1"
    )
    try:
        assert up.returncode == 0, up.stderr
        run = study("measure", "--nodes", "2", "--repeats", "1", "--out", str(tmp_path))
        assert run.returncode == 0, run.stderr
        with (tmp_path / "cluster_staging.csv").open() as f:
            got = {row["mode"]: row for row in csv.DictReader(f)}
        assert sorted(got) == sorted(vm.MODES)
        size = 8 * MIB
        # what the nodes read from the shared file system, as the stage reports it
        assert {m: int(r["job_read_bytes"]) for m, r in got.items()} == {
            "copy": 2 * size,
            "replicate": size,
            "shard": size,
        }
        assert all(float(r["stage_s"]) > 0 and int(r["dataset_bytes"]) == size for r in got.values())
        report = study("report", "--out", str(tmp_path))
        assert report.returncode == 0, report.stderr
        assert "| 2 |" in (tmp_path / "cluster_staging.md").read_text()
        assert (tmp_path / "cluster_staging.png").stat().st_size > 10_000
    finally:
        down = study("down")
    assert down.returncode == 0, down.stderr
    assert not csc.work_dir(name).exists()
    assert not (Path(os.environ.get("VCLUSTER_ROOT", "/run/vcluster")) / name).exists()
    leftover = [
        p.name
        for p in Path("/proc").glob("[0-9]*")
        if (p / "cmdline").exists() and str(csc.work_dir(name)).encode() in _cmdline(p)
    ]
    assert leftover == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
