"""`mlhpc stage-bench`: the study's CSV, plot and summary, on tiny datasets (no timing asserted)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mlhpc.cli import main


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
        for method in ("cp", "tar", "raw-read", "raw-write", "disk-limit"):
            assert (kib, method, "0") in methods
        assert {(kib, "mlhpc", "1"), (kib, "mlhpc", "4")} <= methods
    for row in rows:
        assert float(row["written_mb_s"]) > 0 and float(row["ratio_cp"]) > 0
        if row["method"] == "mlhpc":
            assert row["source_reads"] == "1.0"
    assert (tmp_path / "out" / "stage_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "out" / "stage_bench.md").read_text()
    assert "| files | method | mode |" in summary and "x disk limit" in summary
    assert not (tmp_path / "out" / "scratch").exists()  # generated data is removed


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
    replicate, shard = staged[("replicate", "2")], staged[("shard", "2")]
    assert float(replicate["written_mb_s"]) == pytest.approx(2 * float(replicate["dataset_mb_s"]), rel=0.01)
    assert float(shard["written_mb_s"]) == pytest.approx(float(shard["dataset_mb_s"]), rel=0.01)


def test_help_has_an_example_and_the_model_prints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["stage-bench", "--help"])
    assert "example:" in capsys.readouterr().out
    assert main(["stage-bench", "--out", str(tmp_path), "--model", "--fs-gbs", "1000"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| dataset | mode | 1 node | 16 nodes |") and "DeepCAM" in table
