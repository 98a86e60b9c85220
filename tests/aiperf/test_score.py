"""mlhpc's AIPerf score windows against AIPerf's score.py, run on the same NNI experiment."""

from __future__ import annotations

import calendar
import json
import math
from typing import Any

import pytest

from mlhpc.benchmarks.aiperf.ops_count import OpsPerImage, ops_per_image
from mlhpc.submission_checker.aiperf import EpochRecord, Window, final, valid, windows
from tests.aiperf.aiperf_reference import RESNET50, ReferenceTrial, reference_score

START = calendar.timegm((2020, 6, 2, 23, 35, 0))  # 11:35 PM: the log's clock passes 12 AM, a quirk of score.py
RESNET = OpsPerImage(7_806_583_495.0, 23_053_458_315.0)  # test_ops_count checks these against profiler.py
PER_EPOCH = RESNET.eval * 50_000 + RESNET.train * 1_280_000


def _record(trial: str, hp: int, epoch: int, offset_s: int, accuracy: float) -> EpochRecord:
    return EpochRecord(trial, hp, epoch, START + offset_s, accuracy)


def _branchy_model() -> dict[str, Any]:
    """ResNet-50 with a conv appended past position 175, so trial B's tuned kernel size counts."""
    graph = json.loads(RESNET50.read_text())
    graph["node_list"] += [[175, [7, 7, 64]], [176, [7, 7, 64]], [177, [7, 7, 64]]]
    graph["layer_list"] += [[174, ["StubReLU", 172, 175]], [175, ["StubReLU", 175, 176]],
                            [176, ["StubConv2d", 176, 177, 64, 64, 3, 1, 1]]]
    return graph


# Trial A: two hp rounds, an epoch-0 record at 2300 s; its hp 1 ends after the last window (1.2 h).
# Trial B: dies after two epochs. Trial C (the highest parameter id) ends at 4000 s, which sets
# score.py's duration; its first epoch ends exactly at the 0.3 h window's end (not counted there).
TRIALS = (
    ("A", 0, "resnet", (3, 5), 0, [
        (0, 1, 700, 0.1012), (0, 2, 1400, 0.2034), (0, 3, 2100, 0.3051), (0, 0, 2300, 0.3122),
        (0, 4, 2800, 0.3567), (1, 1, 3500, 0.2511), (1, 2, 4300, 0.4023), (1, 3, 5000, 0.4519)]),
    ("B", 1, "branchy", (5,), 60, [(0, 1, 900, 0.0876), (0, 2, 1800, 0.1543)]),
    ("C", 2, "resnet", (7,), 1000, [(0, 1, 1080, 0.1207), (0, 2, 3000, 0.2675), (0, 3, 4000, 0.3302)]),
)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ReferenceTrial], dict[str, Any]]:
    """The trials, and score.py's cal_report_results of them (one subprocess)."""
    models = {"resnet": json.loads(RESNET50.read_text()), "branchy": _branchy_model()}
    trials = [
        ReferenceTrial(name, parameter_id, models[model], kernels, START + start_s,
                       [_record(name, *row) for row in rows])
        for name, parameter_id, model, kernels, start_s, rows in TRIALS
    ]
    return trials, reference_score(trials, tmp_path_factory.mktemp("score"))


def _ours(trials: list[ReferenceTrial]) -> list[Window]:
    records = [record for trial in trials for record in trial.records]  # score.py's trial order
    ops = {(t.trial_id, hp): ops_per_image(t.model, k) for t in trials for hp, k in enumerate(t.kernel_sizes)}
    return windows(records, ops, start=START)


def test_windows_equal_score_py(experiment: tuple[list[ReferenceTrial], dict[str, Any]]) -> None:
    trials, aiperf = experiment
    ours = _ours(trials)
    formatted = {
        "real_time": [f"{w.run_seconds / 3600.0:.2f}" for w in ours],
        "GFLOPS": [f"{w.ops_per_second / 1e9:.1f}" for w in ours],
        "Error": [f"{100 - w.best_accuracy * 100:.2f}" for w in ours],
        "Score": [f"{w.score / 1e9:.1f}" for w in ours],
    }
    assert [round(w.hours, 9) for w in ours] == [round(0.2 + 0.1 * i, 9) for i in range(11)]
    assert formatted == aiperf["results"]


def test_score_py_read_the_records_we_wrote(experiment: tuple[list[ReferenceTrial], dict[str, Any]]) -> None:
    # Its parse of trial.log (12-hour clock past midnight, hp rounds split at epoch 1) gives our records.
    trials, aiperf = experiment
    assert aiperf["trial_id_list"] == ["A", "B", "C"]
    for trial in trials:
        parsed = [(hp, e, t, a) for hp, rows in enumerate(aiperf["experiment_data"][trial.trial_id])
                  for e, t, a in rows]
        assert parsed == [(r.hp, r.epoch, r.time, r.accuracy) for r in trial.records]


def test_windows_by_hand(experiment: tuple[list[ReferenceTrial], dict[str, Any]]) -> None:
    trials, _ = experiment
    ours = _ours(trials)
    branchy = ops_per_image(_branchy_model(), 5)
    branchy_epoch = branchy.eval * 50_000 + branchy.train * 1_280_000
    assert branchy != RESNET
    # 0.2 h (720 s): A's first epoch only.
    assert ours[0] == Window(0.2, 700, PER_EPOCH, PER_EPOCH / 700, 0.1012,
                             PER_EPOCH * abs(math.log(1 - 0.1012)) / 700)
    # 0.3 h (1080 s): B's first epoch too; C's, at 1080 s exactly, is not before the end.
    assert (ours[1].run_seconds, ours[1].ops) == (900, PER_EPOCH + branchy_epoch)
    # 0.7 h (2520 s): A's latest is its epoch-0 record (2300 s): its accuracy and time count, its
    # epochs stay those of the record before (3). B: 2 epochs; C: 1.
    seven = ours[5]
    assert (seven.run_seconds, seven.best_accuracy) == (2300, 0.3122)
    assert seven.ops == pytest.approx(3 * PER_EPOCH + 2 * branchy_epoch + PER_EPOCH, rel=1e-15)
    assert seven.score == pytest.approx(seven.ops * -math.log(1 - 0.3122) / 2300, rel=1e-15)
    # 1.2 h (4320 s): A hp0 4 epochs + hp1 2 (4300 s), B 2, C 3; A's epoch at 5000 s is past the end.
    assert final(ours) == ours[-1]
    assert ours[-1].ops == pytest.approx(9 * PER_EPOCH + 2 * branchy_epoch, rel=1e-15)
    assert (ours[-1].run_seconds, ours[-1].best_accuracy) == (4300, 0.4023)


def test_default_duration_is_the_last_record_given() -> None:
    # score.py's duration ends at the last record of the last trial (by parameter id), not the latest.
    ops = {("A", 0): RESNET, ("B", 0): RESNET}
    late_first = [_record("A", 0, 1, 4000, 0.2), _record("B", 0, 1, 1500, 0.3)]
    assert windows(late_first, ops, START)[-1].hours == pytest.approx(0.5)
    assert windows(sorted(late_first, key=lambda r: r.time), ops, START)[-1].hours == pytest.approx(1.2)


def test_no_records() -> None:
    assert windows([], {}, START) == []
    assert final([]) is None
    # With a duration but nothing completed: zeros, where score.py divides by -start.
    empty = windows([], {}, START, duration_hours=0.3)
    assert [(w.hours, w.run_seconds, w.ops, w.score) for w in empty] == [(0.2, 0, 0, 0), (0.30000000000000004, 0, 0, 0)]


def test_record_at_the_start_scores_zero_not_zero_division() -> None:
    window = windows([_record("A", 0, 1, 0, 0.5)], {("A", 0): RESNET}, START, duration_hours=0.2)[0]
    assert (window.run_seconds, window.ops, window.ops_per_second, window.score) == (0, PER_EPOCH, 0, 0)


def test_accuracy_one_is_capped() -> None:
    window = windows([_record("A", 0, 1, 600, 1.0)], {("A", 0): RESNET}, START, duration_hours=0.2)[0]
    assert window.best_accuracy == 1.0
    assert window.score == pytest.approx(PER_EPOCH * math.log(1e6) / 600, rel=1e-9)


def test_records_after_the_duration_do_not_count() -> None:
    records = [_record("A", 0, 1, 600, 0.2), _record("A", 0, 2, 1500, 0.9)]
    scored = windows(records, {("A", 0): RESNET}, START, duration_hours=0.2)
    # numpy.arange(0.2, 0.2 + 0.1, 0.1) has two values (0.2 and 0.3: rounding), as in score.py.
    assert [w.hours for w in scored] == [0.2, 0.30000000000000004]
    assert [(w.ops, w.best_accuracy, w.run_seconds) for w in scored] == [(PER_EPOCH, 0.2, 600)] * 2


def test_missing_ops_is_an_error() -> None:
    with pytest.raises(ValueError, match="no ops for trial 'B' hp 0"):
        windows([_record("B", 0, 1, 600, 0.2)], {("A", 0): RESNET}, START)


def test_record_validation() -> None:
    with pytest.raises(ValueError, match=r"accuracy=45\.0"):
        _record("A", 0, 1, 600, 45.0)
    with pytest.raises(ValueError, match="epoch=-1"):
        _record("A", 0, -1, 600, 0.4)


def test_valid() -> None:
    assert valid(0.75, 0.75)
    assert not valid(0.7499, 0.75)
