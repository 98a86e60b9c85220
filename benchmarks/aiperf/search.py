"""AIPerf's search: which architecture a node trains next and with which hyperparameters.

Architectures come from network morphism: a child is its parent's graph with one function-preserving
morph (deeper, wider, a skip), the parent being the best finished architecture so far, or now and
then a random finished one. NNI 3.0's own network-morphism tuner imports with this torch but fails
on its second suggestion under numpy 2 (bayesian.py: `math.exp` of a one-element array), so the
choice of parent is ours, small. Hyperparameters (dropout, the late kernels' size, the batch size)
come from Optuna's TPE. All of it lives in one Optuna study kept in a journal file in the run's
folder on the shared file system: the nodes coordinate through it, with no server.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.benchmarks.aiperf.experiment import read_graph_json
from mlhpc.common.safeio.fileio import atomic_write_text

if TYPE_CHECKING:
    from mlhpc.benchmarks.aiperf.graph import Graph

STUDY_FILE = "study.journal"
STUDY_NAME = "aiperf"
TRIALS_DIR = "trials"
INITIAL_WEIGHTS = "initial.pt"
"""With search.warm_start: a child's weights, morphed from its parent's trained ones."""
TRAINED_WEIGHTS = "trained_{round}.pt"


@dataclass(frozen=True)
class TrialPlan:
    """One training of one architecture: what a node's ranks need to run it."""

    number: int
    """The Optuna trial's number (unique across the nodes)."""
    arch: int
    """The architecture: the number of its first trial, whose folder holds model.json and the epochs."""
    round: int
    """Which of the architecture's trainings (AIPerf's hp index): 0, then TPE's further tries."""
    parent: int | None
    """The architecture it was morphed from; None for the seed and children of the untrained seed."""
    morph: str
    budget: int
    """Epochs it may run."""
    patience: int
    """Epochs without a better accuracy before it stops early."""
    dropout: float
    kernel_size: int
    batch_size: int


def open_study(out: Path, seed: int) -> optuna.Study:
    """The run's study, created by whichever node comes first; each node samples with its own seed."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(out / STUDY_FILE)))
    # constant_liar: a node's TPE treats the other nodes' running trials as poor, so the nodes
    # spread out instead of all asking for the same point.
    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4)
    return optuna.create_study(
        storage=storage, study_name=STUDY_NAME, direction="maximize", sampler=sampler, load_if_exists=True
    )


def distributions(cfg: AIPerfConfig) -> dict[str, Any]:
    low, high = cfg.search.dropout
    return {
        "dropout": FloatDistribution(low, high),
        "kernel_size": CategoricalDistribution(list(cfg.search.kernel_sizes)),
        "batch_size": CategoricalDistribution(list(cfg.search.batch_sizes)),
    }


def arch_dir(out: Path, arch: int) -> Path:
    return out / TRIALS_DIR / f"{arch:05d}"


def epoch_budget(cfg: AIPerfConfig, arch_index: int, nodes: int) -> tuple[int, int]:
    """(epochs, patience) of the architecture started arch_index-th: AIPerf's rounds of one trial a
    node get 15, 30, 45 epochs, then 60; patience min(6 + 2 x round, 20)."""
    loop = arch_index // max(nodes, 1)
    budgets = cfg.search.epochs
    return budgets[min(loop, len(budgets) - 1)], min(cfg.search.patience_base + 2 * loop, 20)


def next_plan(
    study: optuna.Study,
    out: Path,
    cfg: AIPerfConfig,
    nodes: int,
    rng: random.Random,
    previous: TrialPlan | None,
    seed_graph: Graph,
) -> tuple[TrialPlan, optuna.trial.Trial, Graph]:
    """Ask the study for this node's next trial; write its architecture's model.json (a new one) or
    reuse the previous architecture for its next hyperparameter round."""
    from mlhpc.benchmarks.aiperf.graph import Graph

    trial = study.ask(distributions(cfg))
    params = trial.params
    if previous is not None and previous.round + 1 < cfg.search.hp_rounds:
        arch, round_, parent, morph = previous.arch, previous.round + 1, previous.parent, previous.morph
        graph = Graph.from_json(read_graph_json(arch_dir(out, arch) / "model.json"), str(arch_dir(out, arch)))
    else:
        arch, round_ = trial.number, 0
        graph, weights, parent, morph = _new_architecture(study, out, cfg, rng, seed_graph, trial.number)
        folder = arch_dir(out, arch)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "model.json", json.dumps(graph.to_json()))
        if cfg.search.warm_start and parent is not None:
            save_weights(weights, folder / INITIAL_WEIGHTS)
    firsts = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("round") == 0]
    arch_index = sum(1 for t in firsts if t.number < arch)
    budget, patience = epoch_budget(cfg, arch_index, nodes)
    plan = TrialPlan(
        number=trial.number,
        arch=arch,
        round=round_,
        parent=parent,
        morph=morph,
        budget=budget,
        patience=patience,
        dropout=float(params["dropout"]),
        kernel_size=int(params["kernel_size"]),
        batch_size=int(params["batch_size"]),
    )
    for key, value in (("arch", arch), ("round", round_), ("parent", parent), ("morph", morph)):
        trial.set_user_attr(key, value)
    hp = {"hyperparameter": {"dropout_rate": plan.dropout, "kernel_size": plan.kernel_size,
                             "batch_size": plan.batch_size}, "trial": plan.number, "budget": budget}
    atomic_write_text(arch_dir(out, arch) / f"hp_{round_}.json", json.dumps(hp))
    return plan, trial, graph


def _new_architecture(
    study: optuna.Study, out: Path, cfg: AIPerfConfig, rng: random.Random, seed_graph: Graph, number: int
) -> tuple[Graph, dict[str, Any], int | None, str]:
    """The seed for the study's first trial; else a morph of a finished architecture (the best, or
    a random one with probability `exploration`), or of the seed while none has finished. The
    weights are the child's, morphed from the parent's trained ones where warm_start kept them."""
    from mlhpc.benchmarks.aiperf.graph import Graph
    from mlhpc.benchmarks.aiperf.morph import random_morph
    from mlhpc.benchmarks.aiperf.net import build_model

    others = [t for t in study.get_trials(deepcopy=False) if t.number != number]
    if not others:
        return seed_graph, {}, None, "seed"
    finished = [
        t for t in others if t.state == TrialState.COMPLETE and t.value is not None and "arch" in t.user_attrs
    ]
    if not finished:
        parent, graph = None, seed_graph
    else:
        if rng.random() < cfg.search.exploration:
            chosen = rng.choice(finished)
        else:
            chosen = max(finished, key=lambda t: (t.value, -t.number))
        parent = int(chosen.user_attrs["arch"])
        folder = arch_dir(out, parent)
        graph = Graph.from_json(read_graph_json(folder / "model.json"), str(folder / "model.json"))
    weights = build_model(graph).state_dict()
    if cfg.search.warm_start and parent is not None:
        weights.update(_trained_weights(arch_dir(out, parent), weights))
    child, child_weights, described = random_morph(graph, weights, rng)
    return child, child_weights, parent, described


def _trained_weights(folder: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The parent's last trained weights, those of the same names and shapes as its graph's."""
    import torch

    prefix, suffix = TRAINED_WEIGHTS.split("{round}")
    rounds = {}
    for path in folder.glob(TRAINED_WEIGHTS.format(round="*")):
        number = path.name[len(prefix) : -len(suffix)]
        if number.isdigit():
            rounds[int(number)] = path
    if not rounds:
        return {}
    weights = torch.load(rounds[max(rounds)], map_location="cpu", weights_only=True)  # its latest round
    return {k: v for k, v in weights.items() if k in fresh and getattr(v, "shape", None) == fresh[k].shape}


def save_weights(weights: dict[str, Any], path: Path) -> None:
    import torch

    partial = path.with_name(f".{path.name}.partial")
    torch.save(weights, partial)
    partial.replace(path)


def load_initial_weights(model: Any, folder: Path) -> None:
    """Start a warm-started child from the weights its architecture's folder was given (morphed from
    its parent's trained ones); those the kernel-size hyperparameter reshaped start fresh."""
    import torch

    path = folder / INITIAL_WEIGHTS
    if not path.is_file():
        return
    weights = torch.load(path, map_location="cpu", weights_only=True)
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}, strict=False)


def report(study: optuna.Study, trial: optuna.trial.Trial, accuracy: float | None) -> None:
    """Tell the study how the trial ended: its reported accuracy, or failed (no epoch finished)."""
    if accuracy is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, accuracy)
