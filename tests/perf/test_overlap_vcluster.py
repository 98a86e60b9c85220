"""perf/overlap_vcluster.py's pure part (perf/overlap_report.py): hand-written MLLOG files read
into figures, the runs grouped by nodes and staging mode, the table and the plot. No cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "perf"))

from overlap_report import (  # noqa: E402
    ReportError,
    RunFigures,
    aggregate,
    load_runs,
    main,
    plot,
    read_run,
    table,
)

T0 = 1_700_000_000_000


def write_log(path: Path, events: list[tuple[str, float, dict]], seed: int = 7) -> Path:
    """A result file of `(key, seconds after T0, metadata)` events, with noise lines between."""
    lines = ["a rank's stray print", f':::MLLOG {{"namespace": "", "time_ms": {T0}, "event_type": '
             f'"POINT_IN_TIME", "key": "seed", "value": {seed}, "metadata": {{}}}}']  # fmt: skip
    for key, seconds, metadata in events:
        record = {"namespace": "", "time_ms": T0 + seconds * 1000, "event_type": "POINT_IN_TIME"}
        value = 0.2 if key == "eval_error" else None  # the parser keeps an evaluation with a number
        lines.append(":::MLLOG " + json.dumps({**record, "key": key, "value": value, "metadata": metadata}))
    path.write_text("\n".join(lines) + "\n")
    return path


def epochs(first_s: float, count: int, step_s: float) -> list[tuple[str, float, dict]]:
    """`count` evaluations, one every `step_s` from `first_s`."""
    return [("eval_error", first_s + i * step_s, {"epoch_num": i + 1}) for i in range(count)]


def inside(path: Path, ttt_s: float = 40.0, staging_s: float = 10.0, n: int = 4) -> Path:
    """Staging right after run_start, in the scored time."""
    events = [("run_start", 1, {}), ("staging_start", 1, {}), ("staging_stop", 1 + staging_s, {})]
    events += epochs(1 + staging_s + 5, n, 5)
    return write_log(path, [*events, ("run_stop", 1 + ttt_s, {"status": "success", "epoch_num": n})])


def before(path: Path, ttt_s: float = 30.0, staging_s: float = 10.0, status: str = "success") -> Path:
    """Staging before run_start: not scored."""
    events = [("staging_start", 0, {}), ("staging_stop", staging_s, {}), ("run_start", staging_s + 2, {})]
    events += epochs(staging_s + 7, 4, 5)
    return write_log(path, [*events, ("run_stop", staging_s + 2 + ttt_s, {"status": status})])


def test_staging_inside_the_run_is_all_scored(tmp_path: Path) -> None:
    run = read_run(inside(tmp_path / "a.txt"), nodes=2, mode="inside", repeat=1, wall_s=55.0)
    assert (run.ttt_s, run.staging_s, run.staging_scored_s) == (40.0, 10.0, 10.0)
    assert (run.staging_from_run_start_s, run.epochs, run.seed, run.status) == (0.0, 4, 7, "success")
    assert (run.staging_share, run.scored_share, run.wall_s) == (0.25, 0.25, 55.0)


def test_staging_before_run_start_is_not_scored(tmp_path: Path) -> None:
    run = read_run(before(tmp_path / "b.txt"), nodes=1, mode="before", repeat=0)
    assert (run.ttt_s, run.staging_s, run.staging_from_run_start_s) == (30.0, 10.0, -12.0)
    assert run.staging_scored_s == 0.0 and run.scored_share == 0.0
    assert run.staging_share == pytest.approx(1 / 3)


def test_overlapping_staging_counts_only_its_part_inside_the_run(tmp_path: Path) -> None:
    """Staging that begins 3 s before run_start and ends 5 s after it: 5 s of 8 scored."""
    events = [("staging_start", 0, {}), ("run_start", 3, {}), *epochs(6, 3, 4), ("staging_stop", 8, {})]
    log = write_log(tmp_path / "o.txt", [*events, ("run_stop", 23, {"status": "success"})])
    run = read_run(log, nodes=4, mode="overlap", repeat=2)
    assert (run.staging_s, run.staging_from_run_start_s, run.staging_scored_s, run.ttt_s) == (
        8.0,
        -3.0,
        5.0,
        20.0,
    )
    assert run.epochs == 3


def test_a_run_without_staging_lines_has_none(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "n.txt", [("run_start", 0, {}), *epochs(2, 2, 2), ("run_stop", 9, {"status": "aborted"})]
    )
    run = read_run(log, nodes=1, mode="inside", repeat=0)
    assert (run.staging_s, run.staging_share, run.status, run.epochs) == (None, None, "aborted", 2)


def test_an_unfinished_run_is_one_error_naming_the_file(tmp_path: Path) -> None:
    log = write_log(tmp_path / "cut.txt", [("run_start", 0, {}), ("staging_start", 0, {})])
    with pytest.raises(ReportError, match=r"cut\.txt: no run_start or run_stop"):
        read_run(log, nodes=1, mode="inside", repeat=0)


def fig(
    nodes: int, mode: str, ttt: float, staging: float = 10.0, status: str = "success", n: int = 4
) -> RunFigures:
    scored = 0.0 if mode == "before" else staging
    return RunFigures(
        nodes=nodes, mode=mode, repeat=0, status=status, ttt_s=ttt, staging_s=staging,
        staging_from_run_start_s=0.0, staging_scored_s=scored, epochs=n,
    )  # fmt: skip


RUNS = [
    fig(1, "inside", 40), fig(1, "before", 30), fig(1, "inside", 44), fig(1, "before", 32),
    fig(1, "inside", 42), fig(1, "before", 400, status="aborted"),
    fig(2, "inside", 50, n=6), fig(2, "before", 41, n=5), fig(2, "overlap", 45, n=5),
]  # fmt: skip


def test_cells_take_medians_of_successful_runs_and_the_ratio_to_before() -> None:
    cells = {(c.nodes, c.mode): c for c in aggregate(RUNS)}
    assert list(cells) == [(1, "inside"), (1, "before"), (2, "inside"), (2, "before"), (2, "overlap")]
    one = cells[(1, "inside")]
    assert (one.runs, one.failed, one.ttt_median_s, one.ttt_min_s, one.ttt_max_s) == (3, 0, 42, 40, 44)
    assert one.share_median == pytest.approx(10 / 42) and one.epochs == (4, 4, 4)
    ref = cells[(1, "before")]
    assert (ref.runs, ref.failed, ref.ttt_median_s, ref.scored_share_median) == (2, 1, 31, 0.0)
    assert one.vs_reference == pytest.approx(42 / 31) and ref.vs_reference == 1.0
    assert cells[(2, "overlap")].vs_reference == pytest.approx(45 / 41)


def test_without_the_reference_mode_there_is_no_ratio() -> None:
    cells = aggregate([fig(1, "inside", 40), fig(1, "overlap", 35)])
    assert [c.vs_reference for c in cells] == [None, None]
    assert [c.vs_reference for c in aggregate(RUNS, reference="inside") if c.nodes == 2] == [1.0, 0.82, 0.9]


def test_the_table_has_a_row_per_cell_with_spread_shares_and_ratio() -> None:
    text = table(aggregate(RUNS))
    rows = text.splitlines()
    assert rows[0].startswith("| nodes | mode | runs | time-to-train s, median (min-max)") and rows[
        0
    ].endswith("vs before |")
    assert len(rows) == 2 + 5
    assert rows[2] == "| 1 | inside | 3 | 42.0 (40.0-44.0) | 10.0 | 24% | 24% | 4 | 1.35 |"
    assert rows[3] == "| 1 | before | 2 (+1 failed) | 31.0 (30.0-32.0) | 10.0 | 32% | 0% | 4 | 1.00 |"
    assert rows[5] == "| 2 | before | 1 | 41.0 (41.0-41.0) | 10.0 | 24% | 0% | 5 | 1.00 |"


def test_a_cell_whose_runs_all_failed_shows_dashes() -> None:
    (cell,) = aggregate([fig(4, "inside", 99, status="aborted")])
    assert table([cell]).splitlines()[2] == "| 4 | inside | 0 (+1 failed) | - | - | - | - | - | - |"


def test_the_json_round_trip_and_the_report_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "overlap.json"
    results.write_text(json.dumps({"date": "2026-11-28", "runs": [r.to_json() for r in RUNS]}))
    assert load_runs([results]) == RUNS
    rated = tmp_path / "rated.json"
    rated.write_text(
        json.dumps(
            {"runs": [{**RUNS[0].to_json(), "rate": "50mbit"}, {**RUNS[1].to_json(), "rate": "60mbit"}]}
        )
    )
    assert load_runs([results, rated], rate="60mbit") == [RUNS[1]]
    png = tmp_path / "plot.png"
    assert main([str(results), "--png", str(png)]) == 0
    assert capsys.readouterr().out.startswith("| nodes | mode |")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_that_is_not_a_results_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "other.json"
    bad.write_text('{"rows": []}')
    assert main([str(bad)]) == 2
    assert "other.json: not a results file" in capsys.readouterr().err


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    plot(RUNS, tmp_path / "sub" / "p.png", "title")
    assert (tmp_path / "sub" / "p.png").stat().st_size > 1000
