"""The search's parts: AIPerf's epoch budgets, its accuracy extrapolation, the study shared by the
nodes through its journal file (no server), and one trial's epochs logged as they finish."""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.aiperf.config import AIPerfConfig, SearchConfig
from mlhpc.benchmarks.aiperf.graph import Graph
from mlhpc.benchmarks.aiperf.net import build_model
from mlhpc.benchmarks.aiperf.node import NodeGroup
from mlhpc.benchmarks.aiperf.search import (
    INITIAL_WEIGHTS,
    TRAINED_WEIGHTS,
    arch_dir,
    epoch_budget,
    load_initial_weights,
    next_plan,
    open_study,
    report,
    save_weights,
)
from mlhpc.benchmarks.aiperf.seed import resnet
from mlhpc.benchmarks.aiperf.trial import EPOCHS_FILE, predict_accuracy, run_trial

TINY = AIPerfConfig(search=SearchConfig(epochs=(1, 2, 3), hp_rounds=2, batch_sizes=(8,), exploration=0.0))


def tiny_seed() -> Graph:
    return resnet((16, 16, 3), 4, blocks=(1,), width=4, stem="small")


def test_epoch_budgets_follow_the_rounds_of_one_trial_a_node() -> None:
    cfg = AIPerfConfig()  # AIPerf's 15, 30, 45, then 60
    assert [epoch_budget(cfg, i, nodes=4)[0] for i in (0, 3, 4, 8, 12, 16, 40)] == [15, 15, 30, 45, 60, 60, 60]
    assert [epoch_budget(cfg, i, nodes=1)[1] for i in (0, 1, 2, 10)] == [6, 8, 10, 20]


def test_the_extrapolation_predicts_a_rising_curve_and_keeps_the_best_of_a_flat_one() -> None:
    rising = [0.1 + 0.25 * (i / 12) ** 0.5 for i in range(1, 13)]
    predicted = predict_accuracy(rising, 90)
    assert predicted is not None and max(rising) < predicted <= 1
    # AIPerf's anchor point (120, 0.75) pulls a flat curve towards 0.75: up from 0.5 ...
    low = predict_accuracy([0.5] * 12, 90)
    assert low is not None and 0.5 < low < 0.75
    assert predict_accuracy([0.9] * 12, 90) is None  # ... and down from 0.9: below the best, kept
    assert predict_accuracy([0.9, 0.95, 0.99, 1.0] * 3, 90) is None


def test_the_nodes_share_one_study_through_its_journal_file(tmp_path: Path) -> None:
    """Two nodes' studies (two Optuna clients on one journal file) see each other's trials; the
    first is the seed, the next a morph of it while nothing has finished, then of the best."""
    seed = tiny_seed()
    node_a, node_b = open_study(tmp_path, seed=1), open_study(tmp_path, seed=2)
    rng = random.Random(0)
    first, trial_a, graph_a = next_plan(node_a, tmp_path, TINY, 2, rng, None, seed)
    second, trial_b, graph_b = next_plan(node_b, tmp_path, TINY, 2, rng, None, seed)
    assert (first.number, first.morph, first.parent) == (0, "seed", None)
    assert second.number == 1 and second.parent is None and second.morph != "seed"
    assert graph_a == seed and graph_b != seed
    report(node_a, trial_a, 0.4)
    report(node_b, trial_b, 0.6)
    # node a's next training is its architecture's second hyperparameter round (hp_rounds 2)
    again, trial, graph = next_plan(node_a, tmp_path, TINY, 2, rng, first, seed)
    assert (again.arch, again.round, graph) == (0, 1, graph_a)
    report(node_a, trial, None)
    child, _, _ = next_plan(open_study(tmp_path, seed=3), tmp_path, TINY, 2, rng, again, seed)
    assert child.round == 0 and child.parent == 1  # exploration 0: the best finished architecture
    assert child.budget == 2  # the third architecture started: the second round of 2 nodes
    for plan in (first, second, child):
        saved = json.loads((arch_dir(tmp_path, plan.arch) / "model.json").read_text())
        Graph.from_json(saved, "test")
        hp = json.loads((arch_dir(tmp_path, plan.arch) / f"hp_{plan.round}.json").read_text())
        assert hp["hyperparameter"]["kernel_size"] == plan.kernel_size


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_warm_started_child_begins_as_its_trained_parent_ends(seed: int) -> None:
    """search.warm_start: the child's first weights are its parent's trained ones carried through
    the morph (a random one per seed), so before its own training it answers as the trained parent."""
    with tempfile.TemporaryDirectory() as folder:
        _warm_start_round_trip(Path(folder), seed)


def _warm_start_round_trip(tmp_path: Path, seed: int) -> None:
    cfg = replace(TINY, search=replace(TINY.search, warm_start=True, hp_rounds=1))
    seed_graph, rng = tiny_seed(), random.Random(seed)
    study = open_study(tmp_path, seed=seed)
    first, trial, graph = next_plan(study, tmp_path, cfg, 1, rng, None, seed_graph)
    torch.manual_seed(seed)
    parent = build_model(graph, dropout=first.dropout, kernel_size=first.kernel_size)
    with torch.no_grad():  # "trained": weights and batch-norm statistics far from their start
        for p in parent.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        parent.train()
        for _ in range(3):
            parent(torch.randn(8, 3, 16, 16) * 2 + 1)
    save_weights(parent.state_dict(), arch_dir(tmp_path, first.arch) / TRAINED_WEIGHTS.format(round=0))
    report(study, trial, 0.5)
    child_plan, _, child_graph = next_plan(study, tmp_path, cfg, 1, rng, first, seed_graph)
    assert child_plan.parent == first.arch and (arch_dir(tmp_path, child_plan.arch) / INITIAL_WEIGHTS).is_file()
    child = build_model(child_graph, dropout=child_plan.dropout, kernel_size=child_plan.kernel_size)
    load_initial_weights(child, arch_dir(tmp_path, child_plan.arch))
    images = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    parent.eval()
    child.eval()
    with torch.no_grad():
        torch.testing.assert_close(child(images), parent(images), atol=1e-4, rtol=1e-4)
        fresh = build_model(child_graph, dropout=child_plan.dropout, kernel_size=child_plan.kernel_size).eval()
        assert not torch.allclose(fresh(images), parent(images), atol=1e-2)  # a cold start would not


def _loader(n: int, classes: int = 4, size: int = 16, batch: int = 8) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % classes
    images = torch.randn(n, 3, size, size, generator=g) * 0.3 + labels.view(-1, 1, 1, 1).float()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=batch)


def _plan(budget: int, patience: int = 5):
    from mlhpc.benchmarks.aiperf.search import TrialPlan

    return TrialPlan(number=0, arch=0, round=0, parent=None, morph="seed", budget=budget, patience=patience,
                     dropout=0.0, kernel_size=3, batch_size=8)


GROUP = NodeGroup(node=0, nodes=1, rank=0, size=1, device=torch.device("cpu"), host="here")


def test_a_trial_logs_each_finished_epoch_and_reports_its_best(tmp_path: Path) -> None:
    log = tmp_path / EPOCHS_FILE
    model = build_model(tiny_seed())
    outcome = run_trial(_plan(3), model, (_loader(32), _loader(16)), TINY, GROUP, time.time() + 600, log,
                        say=lambda _: None)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2, 3] and outcome.epochs == 3 and not outcome.cut
    assert outcome.best_accuracy == max(line["accuracy"] for line in lines) == outcome.reported
    assert all(0 <= line["accuracy"] <= 1 and line["round"] == 0 for line in lines)


def test_the_deadline_cuts_a_trial_and_its_unfinished_epoch_is_not_logged(tmp_path: Path) -> None:
    log = tmp_path / EPOCHS_FILE
    outcome = run_trial(_plan(3), build_model(tiny_seed()), (_loader(32), _loader(16)), TINY, GROUP,
                        time.time() - 1, log, say=lambda _: None)
    assert outcome.cut and outcome.epochs == 0 and outcome.reported is None and not log.exists()


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stopping_after_patience_epochs_without_a_better_accuracy(tmp_path: Path, patience: int) -> None:
    log = tmp_path / EPOCHS_FILE
    model = build_model(tiny_seed())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every prediction class 0: the accuracy never improves after epoch 1
    frozen = TINY.optimizer.__class__(base_learning_rate=1e-12)
    cfg = AIPerfConfig(search=TINY.search, optimizer=frozen)
    outcome = run_trial(_plan(6, patience), model, (_loader(32), _loader(16)), cfg, GROUP, time.time() + 600,
                        log, say=lambda _: None)
    assert outcome.epochs == 1 + patience
