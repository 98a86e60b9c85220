"""An AIPerf run: the run's folder on the shared file system, and each node's search loop in it.

Every node runs the same loop, with no server: its leader asks the shared study for a trial, the
node's ranks train it, the leader logs each finished epoch and tells the study the result, until
the run's deadline. The folder, `<out>/aiperf/`, holds:

    aiperf.json           the run's facts: config, start time, duration, dataset sizes (written once)
    study.journal         Optuna's journal of the search (every node appends, under its file lock)
    trials/<arch>/        one architecture: model.json (NNI's graph JSON), hp_<round>.json (the
                          hyperparameters of each training of it), epochs.jsonl (one line an epoch)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.common.contract.config import to_dict
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.fileio import atomic_write_text

RUN_DIR = "aiperf"
RUN_FILE = "aiperf.json"
FORMAT = "mlhpc-aiperf/1"
LOCK_FILE = ".aiperf.lock"
JOIN_TIMEOUT_S = 600.0
NODE_ENV = "MLHPC_AIPERF_NODE"
"""Set by `mlhpc run aiperf --instances K` for each one-rank node it starts on one machine: `<node>/<nodes>`."""


@dataclass(frozen=True)
class RunFacts:
    """aiperf.json: what every node and the scorer read."""

    start: float
    duration_s: float
    train_images: int
    eval_images: int
    classes: int
    seed: int

    @property
    def deadline(self) -> float:
        return self.start + self.duration_s


@contextlib.contextmanager
def run_lock(folder: Path) -> Iterator[None]:
    """Wait for the run folder's lock (a POSIX lock: NFS and Lustre pass it between nodes, and a
    killed holder's lock is dropped by the kernel)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        waited_until = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN) or time.monotonic() > waited_until:
                    raise DataError(f"cannot lock {folder / LOCK_FILE} ({e.strerror}); check the file system") from e
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def join_run(
    out: Path, cfg: AIPerfConfig, train_images: int, eval_images: int, classes: int, seed: int, nodes: int
) -> RunFacts:
    """The run in `out`: started by the first node to come (which writes aiperf.json), joined by the
    others. A finished run's folder is refused: its score would mix two runs."""
    with run_lock(out):
        path = out / RUN_FILE
        if not path.exists():
            facts = RunFacts(
                start=time.time(),
                duration_s=cfg.search.duration_minutes * 60.0,
                train_images=train_images,
                eval_images=eval_images,
                classes=classes,
                seed=seed,
            )
            record = {
                "format": FORMAT,
                "benchmark": "aiperf",
                "start": facts.start,
                "duration_s": facts.duration_s,
                "train_images": train_images,
                "eval_images": eval_images,
                "classes": classes,
                "seed": seed,
                "nodes": nodes,
                "config": to_dict(cfg),
            }
            atomic_write_text(path, json.dumps(record, indent=1))
            return facts
        facts = read_run_facts(out)
        if time.time() > facts.deadline:
            raise DataError(f"{out} holds an AIPerf run that has ended; pass a new --out for a new run")
        return facts


def read_run_facts(run_dir: Path) -> RunFacts:
    """aiperf.json, checked: a hostile or torn file is one line naming it."""
    from mlhpc.common.safeio import safe_json

    path = run_dir / RUN_FILE
    try:
        data = safe_json.loads(path.read_bytes(), dict)
        facts = RunFacts(
            start=_number(data, "start", 0, 2**35),
            duration_s=_number(data, "duration_s", 1e-3, 10**8),
            train_images=int(_number(data, "train_images", 1, 2**40)),
            eval_images=int(_number(data, "eval_images", 1, 2**40)),
            classes=int(_number(data, "classes", 2, 10**7)),
            seed=int(_number(data, "seed", 0, 2**63)),
        )
        if data.get("format") != FORMAT:
            raise ValueError(f"format {str(data.get('format'))[:40]!r}, not {FORMAT!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not an AIPerf run's facts ({str(e)[:200]}); point at an mlhpc AIPerf run") from e
    return facts


def _number(data: dict[str, Any], key: str, low: float, high: float) -> float:
    value = data[key]
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"{key}={str(value)[:40]} is not a number from {low} to {high}")
    return float(value)


def work(out: Path, cfg: AIPerfConfig, data_root: Path, seed: int, device: str = "auto") -> int:
    """This process's part of the run: one rank of one node, until the deadline. Returns the trials
    the node ran (its leader's count; 0 on the other ranks)."""
    import torch

    from mlhpc.benchmarks.aiperf.data import build_loaders, validate_imagenet
    from mlhpc.benchmarks.aiperf.graph import Graph
    from mlhpc.benchmarks.aiperf.net import build_model
    from mlhpc.benchmarks.aiperf.node import join_node, leave_node
    from mlhpc.benchmarks.aiperf.search import (
        INITIAL_WEIGHTS,
        TRAINED_WEIGHTS,
        arch_dir,
        next_plan,
        open_study,
        report,
        save_weights,
    )
    from mlhpc.benchmarks.aiperf.seed import resnet
    from mlhpc.benchmarks.aiperf.trial import EPOCHS_FILE, run_trial

    group = join_node(device)
    index = validate_imagenet(data_root)
    classes = len(index.classes)
    train_images, eval_images = len(index.train), len(index.val)
    facts = join_run(out, cfg, train_images, eval_images, classes, seed, group.nodes) if group.leads else None
    facts = group.broadcast(facts)
    size = cfg.data.image_size
    seed_graph = resnet(
        (size, size, 3), classes, blocks=tuple(cfg.seed.blocks), width=cfg.seed.width, stem=cfg.seed.stem
    )
    study = open_study(out, seed * 1009 + group.node) if group.leads else None
    rng = random.Random(seed * 7919 + group.node)
    previous = None
    trials = 0
    try:
        while True:
            message = None
            if group.leads and time.time() < facts.deadline:
                plan, trial, graph = next_plan(study, out, cfg, group.nodes, rng, previous, seed_graph)
                message = (plan, graph.to_json())
            message = group.broadcast(message)
            if message is None:
                break
            plan, graph_json = message
            graph = Graph.from_json(graph_json, f"trial {plan.number}")
            torch.manual_seed(seed * 100003 + plan.number)  # the same initial weights on the node's ranks
            model = build_model(graph, dropout=plan.dropout, kernel_size=plan.kernel_size)
            if cfg.search.warm_start and plan.round == 0:
                _warm_start(model, arch_dir(out, plan.arch) / INITIAL_WEIGHTS)
            loaders = build_loaders(
                index,
                image_size=size,
                batch_size=max(1, plan.batch_size // group.size),
                rank=group.rank,
                world_size=group.size,
                seed=seed + plan.number,
                workers=cfg.data.num_workers,
            )
            log_path = arch_dir(out, plan.arch) / EPOCHS_FILE
            outcome = run_trial(plan, model, loaders[:2], cfg, group, facts.deadline, log_path)
            if group.leads:
                report(study, trial, outcome.reported)
                if cfg.search.warm_start and outcome.epochs:
                    save_weights(model.state_dict(), arch_dir(out, plan.arch) / TRAINED_WEIGHTS.format(round=plan.round))
                trials += 1
            previous = plan
    finally:
        leave_node(group)
    return trials


def _warm_start(model: Any, path: Path) -> None:
    """The child's morphed weights (the kernel-size hyperparameter may have reshaped some late
    convolutions: those start fresh)."""
    import torch

    if not path.is_file():
        return
    weights = torch.load(path, map_location="cpu", weights_only=True)
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}, strict=False)
