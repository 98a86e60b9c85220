"""`mlhpc stage-bench`: the study's CSV, plot and summary, on tiny datasets (no speed asserted);
its figures on the user's clock, told apart from the sync-inclusive extra with a slowed `sync`."""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlhpc.cli import main
from mlhpc.staging.comm import CallbackComm
from mlhpc.study import baselines, clock, dataset, rank_groups, raw
from tests.helpers.datasets import tree

COPIES = ("cp", "tar", "mlhpc")  # staged data to read once; the raw disk measures stage nothing


def run_bench(out: Path, *extra: str) -> list[dict[str, str]]:
    args = [
        "stage-bench",
        "--out",
        str(out),
        "--total-mib",
        "2",
        "--file-kib",
        "64,1024",
        "--repeats",
        "1",
        "--warm",
    ]
    assert main([*args, *extra]) == 0
    with open(out / "stage_bench.csv") as handle:
        return list(csv.DictReader(handle))


def test_study_writes_csv_plot_and_summary(tmp_path: Path) -> None:
    rows = run_bench(tmp_path / "out", "--workers", "1,4", "--ranks", "1")
    methods = {(r["file_kib"], r["method"], r["workers"]) for r in rows}
    for kib in ("64", "1024"):
        for method in ("cp", "tar", "raw-read", "raw-write", "copy-limit"):
            assert (kib, method, "0") in methods
        assert {(kib, "mlhpc", "1"), (kib, "mlhpc", "4")} <= methods
    for row in rows:
        assert float(row["written_mb_s"]) > 0 and float(row["ratio_cp"]) > 0
        # MB/s is on the user's clock: the bytes over wall_s, not over the sync-inclusive time
        wall = float(row["wall_s"])
        assert float(row["dataset_mb_s"]) == pytest.approx(int(row["dataset_bytes"]) / wall / 1e6, rel=0.03)
        if row["method"] == "mlhpc":
            assert row["source_reads"] == "1.0"
        if row["method"] in COPIES:
            assert float(row["read_once_s"]) >= wall
            assert float(row["extra_with_sync_s"]) >= wall
            assert float(row["ratio_cp_read_once"]) > 0 and float(row["ratio_tar_read_once"]) > 0
        else:  # no staged copy to read or sync
            assert row["read_once_s"] == row["extra_with_sync_s"] == row["ratio_cp_read_once"] == ""
        if row["method"] == "cp":
            assert row["ratio_cp"] == row["ratio_cp_read_once"] == "1.0"
    assert (tmp_path / "out" / "stage_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "out" / "stage_bench.md").read_text()
    assert "| files | method | mode |" in summary and "x copy limit" in summary
    assert "| s | s read once | MB/s |" in summary and summary.count("| extra: s with sync |") == 1
    assert not (tmp_path / "out" / "scratch").exists()  # generated data is removed


READ_S, SYNC_S = 0.5, 1.5  # far apart and far above what a tiny copy takes, so that no figure hides another


def slowed(monkeypatch: pytest.MonkeyPatch, read_s: float, sync_s: float) -> list[Path]:
    """`read_all` made `read_s` slower and `sync` a pause of `sync_s` (nothing written back: a real
    sync waits on the whole machine); returns the roots that were read."""
    roots: list[Path] = []
    read_all: Callable[[Path], None] = dataset.read_all

    def slow_read(root: Path) -> None:
        roots.append(root)
        time.sleep(read_s)
        read_all(root)

    monkeypatch.setattr(dataset, "read_all", slow_read)
    monkeypatch.setattr(os, "sync", lambda: time.sleep(sync_s))
    return roots


def test_the_users_clock_leaves_the_read_and_the_sync_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = slowed(monkeypatch, READ_S, SYNC_S)
    dest = tmp_path / "dest"

    def copy() -> None:
        dest.mkdir()
        (dest / "a.bin").write_bytes(b"x" * 1000)

    timing = clock.user_clock(copy, dest)
    assert roots == [dest]
    assert timing.wall_s < READ_S  # the copy alone
    assert READ_S <= timing.read_once_s - timing.wall_s < SYNC_S  # the read, not the sync
    assert SYNC_S <= timing.extra_with_sync_s - timing.wall_s < SYNC_S + READ_S  # the sync, not the read
    ranks = clock.user_clock(lambda: 0.25, dest)  # ranks timed inside their launch: their seconds
    assert ranks.wall_s == pytest.approx(0.25)
    assert ranks.read_once_s >= 0.25 + READ_S and ranks.extra_with_sync_s >= 0.25 + SYNC_S


def test_a_plan_row_times_the_staging_then_the_read_then_the_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset.make_dataset(tmp_path / "src", 256 << 10, 64 << 10)
    row = {"src": str(tmp_path / "src"), "dest": str(tmp_path / "dest"), "mode": "replicate", "workers": 2}
    plan = [row | {"cold": False}, row | {"cold": False, "read": False, "sync": False}]
    roots = slowed(monkeypatch, READ_S, SYNC_S)
    timed, untimed = rank_groups.run_plan(CallbackComm(), plan)
    assert roots == [tmp_path / "dest" / "node0"]  # the node's copy, read once; not for the second row
    assert timed["wall_s"] < SYNC_S
    assert READ_S <= timed["read_once_s"] - timed["wall_s"] < SYNC_S
    assert SYNC_S <= timed["extra_with_sync_s"] - timed["wall_s"] < SYNC_S + READ_S
    assert clock.Timing.from_row(untimed) == clock.Timing(wall_s=untimed["wall_s"])


def test_the_study_reports_the_users_clock_with_sync_only_as_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_s = 0.3  # every copy and raw measure syncs once: keep the study short
    slowed(monkeypatch, 0.0, sync_s)
    rows = run_bench(tmp_path / "out", "--workers", "1", "--ranks", "1", "--file-kib", "1024")
    copies = [r for r in rows if r["method"] in COPIES]
    assert {r["method"] for r in copies} == set(COPIES)
    for row in copies:
        wall, read, with_sync = (float(row[k]) for k in ("wall_s", "read_once_s", "extra_with_sync_s"))
        assert with_sync - wall >= sync_s  # the sync is in the extra and not in the user's clock
        assert wall <= read < wall + sync_s  # nor in the read-once time
        assert float(row["written_mb_s"]) == pytest.approx(2 * (1 << 20) / wall / 1e6, rel=0.03)
    table = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (tmp_path / "out" / "stage_bench.md").read_text().splitlines()
        if line.startswith("| ")
    ]
    cells = dict(zip(table[0], next(line for line in table if line[1] == "mlhpc"), strict=True))
    row = next(r for r in copies if r["method"] == "mlhpc")
    assert float(cells["s"]) == pytest.approx(float(row["wall_s"]), abs=1e-3)
    assert float(cells["s read once"]) == pytest.approx(float(row["read_once_s"]), abs=1e-3)
    assert float(cells["extra: s with sync"]) == pytest.approx(float(row["extra_with_sync_s"]), abs=1e-3)


def test_copies_go_to_the_local_dir_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "local"
    destinations: list[Path] = []
    for name in ("cp_timing", "tar_timing", "raw_copy_seconds"):
        measure = getattr(baselines, name)

        def recording(*args: Any, _measure: Any = measure, **kwargs: Any) -> Any:
            destinations.append(Path(args[1]))
            return _measure(*args, **kwargs)

        monkeypatch.setattr(baselines, name, recording)
    run_plan = rank_groups.run_plan_in_ranks

    def recording_plan(plan: list[dict[str, Any]], *args: Any) -> list[dict[str, Any]]:
        destinations.extend(Path(row["dest"]) for row in plan)
        return run_plan(plan, *args)

    monkeypatch.setattr(rank_groups, "run_plan_in_ranks", recording_plan)
    rows = run_bench(
        tmp_path / "out", "--workers", "2", "--ranks", "1", "--file-kib", "64", "--local-dir", str(local)
    )
    assert {r["method"] for r in rows} == {"cp", "tar", "raw-read", "raw-write", "copy-limit", "mlhpc"}
    assert len(destinations) == 3 + len(raw.RAW_DEPTHS)  # cp, tar, stage, and a copy limit per depth
    # in one folder the study made in --local-dir under a fresh name, removed with all in it
    assert len({d.parent for d in destinations}) == 1
    assert all(
        d.parent.parent == local and d.parent.name.startswith("stage-bench-local-") for d in destinations
    )
    assert list(local.iterdir()) == []


def test_parallel_dd_copies_every_file_byte_for_byte(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"big.bin": os.urandom((17 << 20) + 5), "sub/small.bin": b"z" * 100}  # O_DIRECT's tails
    for name, data in files.items():
        (src / name).write_bytes(data)
    baselines.parallel_dd(src, tmp_path / "dest", streams=2)
    assert {
        p.relative_to(tmp_path / "dest").as_posix(): p.read_bytes()
        for p in (tmp_path / "dest").rglob("*.bin")
    } == files


def test_timings_reject_an_unknown_method(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rsync"):
        baselines.timings_by_round(tmp_path, 1, tmp_path, 1, False, ("cp", "rsync"))


def test_raw_baselines_keep_one_depth_chosen_by_median(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # depth 4 is lucky once and slow otherwise; the faster run of each round would give [1, 2, 2]
    seconds = {raw.RAW_DEPTHS[0]: iter([1.0, 3.0, 3.0]), raw.RAW_DEPTHS[1]: iter([2.0, 2.0, 2.0])}
    monkeypatch.setattr(baselines, "raw_read_seconds", lambda src, cold, depth: next(seconds[depth]))
    cp = clock.Timing(wall_s=4.0, read_once_s=5.0, extra_with_sync_s=6.0)
    monkeypatch.setattr(baselines, "cp_timing", lambda src, dest, cold: cp)
    times = baselines.timings_by_round(tmp_path, 1, tmp_path, 3, False, ("cp", "raw-read"))
    assert times == {"cp": [cp] * 3, "raw-read": [clock.Timing(wall_s=2.0)] * 3}
    assert clock.medians(times)["raw-read"] == clock.Timing(
        wall_s=2.0, read_once_s=None, extra_with_sync_s=None
    )


def test_raw_read_reads_every_source_byte_once_with_requests_in_flight(tmp_path: Path) -> None:
    big, small = tmp_path / "data" / "big.bin", tmp_path / "data" / "sub" / "small.bin"
    small.parent.mkdir(parents=True)
    big.write_bytes(os.urandom((40 << 20) + 5))  # not a whole number of pages: O_DIRECT's hard case
    small.write_bytes(b"y" * 100)
    assert dataset.source_files(tmp_path / "data") == [big, small]
    pieces = raw._read_pieces([big], 4)  # one file: cut so that several requests are in flight
    assert len(pieces) == 3
    assert [(offset, length) for _, offset, length in pieces] == [
        (0, 16 << 20),
        (16 << 20, 16 << 20),
        (32 << 20, (8 << 20) + 5),
    ]
    assert [p[1:] for p in raw._read_pieces([big, small], 2)] == [(0, (40 << 20) + 5), (0, 100)]
    assert raw.raw_read_seconds(tmp_path / "data", cold=False) > 0


def test_unknown_mode_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stage-bench", "--out", str(tmp_path), "--modes", "mirror"]) == 2
    assert capsys.readouterr().err == "mlhpc: error: --modes mirror unknown; use replicate, shard, copy\n"


@pytest.mark.distributed
def test_study_with_two_ranks_as_two_nodes(tmp_path: Path) -> None:
    rows = run_bench(tmp_path / "out", "--workers", "4", "--ranks", "2", "--repeats", "2", "--file-kib", "64")
    staged = {(r["mode"], r["ranks"]): r for r in rows if r["method"] == "mlhpc"}
    assert set(staged) == {("replicate", "2"), ("shard", "2")}
    for row in staged.values():
        assert row["source_reads"] == "1.0"  # both modes read the source once in total
        assert float(row["read_once_s"]) >= float(row["wall_s"]) > 0  # every rank read its copy once
        assert float(row["extra_with_sync_s"]) >= float(row["wall_s"])
    replicate, shard = staged[("replicate", "2")], staged[("shard", "2")]
    # Both figures are rounded to 0.1 MB/s: on a slow machine that is more than 1 %.
    assert float(replicate["written_mb_s"]) == pytest.approx(2 * float(replicate["dataset_mb_s"]), rel=0.01, abs=0.15)
    assert float(shard["written_mb_s"]) == pytest.approx(float(shard["dataset_mb_s"]), rel=0.01, abs=0.1)


def test_help_has_an_example_and_the_model_prints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["stage-bench", "--help"])
    assert "example:" in capsys.readouterr().out
    assert main(["stage-bench", "--out", str(tmp_path), "--model", "--fs-gbs", "1000"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| dataset | mode | 1 node | 16 nodes |") and "DeepCAM" in table


def test_folders_of_the_users_named_like_the_studys_are_left_alone(tmp_path: Path) -> None:
    """The study once removed --local-dir's dest and raw-write and the whole --out/scratch."""
    local, out = tmp_path / "local", tmp_path / "out"
    for folder in (local / "dest", local / "raw-write", out / "scratch", out / "scratch" / "data-64k"):
        folder.mkdir(parents=True)
        (folder / "keep.txt").write_bytes(b"a user's file\n")
    before_local, before_out = tree(local, folders=True), tree(out, folders=True)
    run_bench(out, "--workers", "2", "--ranks", "1", "--file-kib", "64", "--local-dir", str(local))
    assert tree(local, folders=True) == before_local
    after = tree(out, folders=True)
    assert {k: v for k, v in after.items() if not k.startswith("stage_bench.")} == before_out


def test_a_scratch_folder_that_is_not_a_study_dataset_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = tmp_path / "scratch"
    (scratch / "data-64k").mkdir(parents=True)
    (scratch / "data-64k" / "mine.bin").write_bytes(b"x")
    args = ["stage-bench", "--out", str(tmp_path / "out"), "--scratch", str(scratch), "--file-kib", "64"]
    assert (
        main([*args, "--total-mib", "1", "--repeats", "1", "--warm", "--ranks", "1", "--workers", "1"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data-64k exists and is not a dataset the study made" in err
    assert tree(scratch, folders=True) == {"data-64k": None, "data-64k/mine.bin": b"x"}
    assert [p.name for p in scratch.iterdir()] == ["data-64k"]  # its own work folder removed


@pytest.mark.parametrize("option", ["--out", "--local-dir", "--scratch"])
def test_an_output_inside_the_data_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    data = tmp_path / "data"
    dataset.make_dataset(data, 256 << 10, 64 << 10)
    before = tree(data, folders=True)
    outputs = {"--out": str(tmp_path / "out"), option: str(data / "inside")}
    argv = ["stage-bench", "--data", str(data), *(w for pair in outputs.items() for w in pair)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{option} {data / 'inside'} is inside the input {data}" in err
    assert tree(data, folders=True) == before


def test_the_cache_is_dropped_once_per_dataset_and_the_source_evicted_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dropping the machine's whole cache before every step took 5.5 min on 16 MiB (80 drops)."""
    drops: list[int] = []
    evicted: list[Path] = []
    evict = dataset.evict
    monkeypatch.setattr(dataset, "drop_caches", lambda: drops.append(1) or True)
    monkeypatch.setattr(dataset, "evict", lambda src: evicted.append(src) or evict(src))
    monkeypatch.setattr(dataset, "SETTLE_S", 0.0)
    args = ["stage-bench", "--out", str(tmp_path / "out"), "--total-mib", "1", "--file-kib", "64,256"]
    assert main([*args, "--repeats", "2", "--ranks", "1", "--workers", "1,2"]) == 0
    assert len(drops) == 2  # one per dataset, not one per step
    sources = {p.name for p in evicted}
    assert sources == {"data-64k", "data-256k"}
    # per dataset and round: cp, tar, raw read and copy limit per depth; then each stage run
    per_dataset = 2 * (2 + 2 * len(raw.RAW_DEPTHS)) + 2 * 2
    assert len(evicted) == 2 * per_dataset
    first = capsys.readouterr().out.splitlines()[0]
    assert (
        first.startswith("stage-bench: 2 dataset(s), 2 MiB in all; about ")
        and " s if the disks give" in first
    )


def test_the_estimate_grows_with_the_plan() -> None:
    import argparse

    from mlhpc.study.bench import estimate_seconds

    def args(**changes: Any) -> argparse.Namespace:
        plain = {"data": None, "repeats": 1, "ranks": [1], "workers": [1], "warm": True}
        return argparse.Namespace(**(plain | changes))

    one = [(64, 4096, 256 << 20)]
    base = estimate_seconds(one, args(), ["replicate"])
    assert 0 < base < estimate_seconds(one, args(repeats=3), ["replicate"])
    assert base < estimate_seconds(one * 2, args(), ["replicate"])
    assert base < estimate_seconds(one, args(ranks=[1, 2]), ["replicate", "shard"])
    assert base < estimate_seconds(one, args(warm=False), ["replicate"])
