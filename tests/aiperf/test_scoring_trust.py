"""A run folder's files are hostile to `mlhpc check`: whatever an epoch line, a graph or the run's
facts hold, scoring gives a score or one DataError naming the file, never another exception; and
a run built by hand scores as AIPerf's arithmetic says."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.benchmarks.aiperf.experiment import FORMAT
from mlhpc.benchmarks.aiperf.ops_count import ops_per_image
from mlhpc.benchmarks.aiperf.scoring import score_run
from mlhpc.benchmarks.aiperf.seed import resnet
from mlhpc.common.contract.config import to_dict
from mlhpc.common.errors import DataError

START = 1_800_000_000.0
SEED = resnet((32, 32, 3), 10, blocks=(1, 1), width=4, stem="small")


def make_run(root: Path, lines: list[str], *, kernel: int = 3, duration_s: float = 720.0) -> Path:
    """A run folder as `mlhpc run aiperf` writes it: one architecture (the mini seed), one training."""
    cfg = AIPerfConfig()
    config = to_dict(cfg)
    config["score"] = {"threshold": 0.5, "first_window_hours": 0.05, "step_hours": 0.05}
    facts = {"format": FORMAT, "benchmark": "aiperf", "start": START, "duration_s": duration_s,
             "train_images": 600, "eval_images": 200, "classes": 10, "seed": 1, "nodes": 1, "config": config}
    root.mkdir(parents=True, exist_ok=True)
    (root / "aiperf.json").write_text(json.dumps(facts))
    arch = root / "trials" / "00000"
    arch.mkdir(parents=True, exist_ok=True)
    (arch / "model.json").write_text(json.dumps(SEED.to_json()))
    (arch / "hp_0.json").write_text(json.dumps({"hyperparameter": {"kernel_size": kernel, "dropout_rate": 0.1}}))
    (arch / "epochs.jsonl").write_text("".join(line + "\n" for line in lines))
    return root


def epoch(n: int, seconds: float, accuracy: float) -> str:
    return json.dumps({"trial": 0, "round": 0, "epoch": n, "time": START + seconds, "accuracy": accuracy,
                       "node": "node01", "node_index": 0})


def test_a_run_built_by_hand_scores_as_aiperfs_arithmetic(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", [epoch(1, 100, 0.3), epoch(2, 200, 0.55), epoch(3, 400, 0.62)])
    score = score_run(run)
    ops = ops_per_image(SEED.to_json(), 3)
    per_epoch = ops.eval * 200 + ops.train * 600
    # windows end at 0.05 h (180 s) and 0.1, 0.15, 0.2 h: the first sees epoch 1 only
    first, *_, last = score.windows
    assert first.run_seconds == pytest.approx(100) and first.ops == pytest.approx(per_epoch)
    assert last.ops == pytest.approx(3 * per_epoch) and last.run_seconds == pytest.approx(400)
    assert last.score == pytest.approx(3 * per_epoch * abs(math.log(1 - 0.62)) / 400)
    assert score.valid and score.best_accuracy == 0.62 and score.epochs == 3 and len(score.windows) == 4


def test_a_run_that_never_reaches_the_threshold_is_scored_and_not_valid(tmp_path: Path) -> None:
    score = score_run(make_run(tmp_path / "run", [epoch(1, 100, 0.3), epoch(2, 200, 0.45)]))
    assert not score.valid and score.final is not None and score.final.score > 0


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
FIELDS = ("trial", "round", "epoch", "time", "accuracy", "node", "node_index")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(FIELDS),
    value=VALUES,
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_any_epoch_line_is_scored_or_one_data_error(tmp_path_factory, field: str, value, raw) -> None:
    good = json.loads(epoch(2, 200, 0.6))
    good[field] = value
    line = raw.decode("latin-1").replace("\n", " ") if raw is not None else json.dumps(good)
    run = make_run(tmp_path_factory.mktemp("h") / "run", [epoch(1, 100, 0.5), line, epoch(3, 300, 0.7)])
    try:
        score = score_run(run)
    except DataError as e:
        assert "\n" not in str(e) and "epochs.jsonl:2" in str(e)
        return
    assert score.epochs == 3 and all(math.isfinite(w.score) for w in score.windows)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["start", "duration_s", "train_images", "eval_images", "classes", "format", "seed"]),
       value=VALUES)
def test_any_run_facts_are_scored_or_one_data_error(tmp_path_factory, key: str, value) -> None:
    run = make_run(tmp_path_factory.mktemp("h") / "run", [epoch(1, 100, 0.5)])
    facts = json.loads((run / "aiperf.json").read_text())
    facts[key] = value
    (run / "aiperf.json").write_text(json.dumps(facts, allow_nan=True))
    try:
        score = score_run(run)
    except DataError as e:
        # the facts themselves, or the epochs they now put outside the run
        assert "\n" not in str(e) and ("aiperf.json" in str(e) or "epochs.jsonl:1" in str(e))
        return
    assert all(math.isfinite(w.score) for w in score.windows)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["threshold", "first_window_hours", "step_hours", "train_images", "eval_images", None]),
       value=VALUES)
def test_any_score_settings_are_scored_or_one_data_error(tmp_path_factory, key: str | None, value) -> None:
    run = make_run(tmp_path_factory.mktemp("h") / "run", [epoch(1, 100, 0.5)])
    facts = json.loads((run / "aiperf.json").read_text())
    if key is None:
        facts["config"]["score"] = value
    else:
        facts["config"]["score"][key] = value
    (run / "aiperf.json").write_text(json.dumps(facts, allow_nan=True))
    try:
        score = score_run(run)
    except DataError as e:
        assert "\n" not in str(e) and "aiperf.json" in str(e)
        return
    assert all(math.isfinite(w.score) for w in score.windows)
