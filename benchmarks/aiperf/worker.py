"""Each node's part of an AIPerf run, with no server: the node's leader asks the shared study for a
trial, the node's ranks train it, the leader logs each finished epoch and tells the study the
result, until the run's deadline (experiment.py keeps the run's folder and facts)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.benchmarks.aiperf.experiment import join_run


def work(out: Path, cfg: AIPerfConfig, data_root: Path, seed: int, device: str = "auto") -> int:
    """This process's part of the run: one rank of one node, until the deadline. Returns the trials
    the node ran (its leader's count; 0 on the other ranks)."""
    import torch

    from mlhpc.benchmarks.aiperf.data import build_loaders, validate_imagenet
    from mlhpc.benchmarks.aiperf.graph import Graph
    from mlhpc.benchmarks.aiperf.net import build_model
    from mlhpc.benchmarks.aiperf.node import join_node, leave_node
    from mlhpc.benchmarks.aiperf.search import (
        TRAINED_WEIGHTS,
        arch_dir,
        load_initial_weights,
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
    study = open_study(out, (seed * 1009 + group.node) % 2**32) if group.leads else None
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
                load_initial_weights(model, arch_dir(out, plan.arch))
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
            try:
                outcome = run_trial(plan, model, loaders[:2], cfg, group, facts.deadline, log_path)
            except torch.OutOfMemoryError:
                if group.distributed:  # the node's other ranks wait in a collective: the node is lost
                    raise
                # a child too large for the device fails alone, as in AIPerf; the node goes on
                print(f"node {group.node} trial {plan.number}: out of memory; the search goes on", flush=True)
                report(study, trial, None)
                previous, model = plan, None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            if group.leads:
                report(study, trial, outcome.reported)
                if cfg.search.warm_start and outcome.epochs:
                    save_weights(model.state_dict(), arch_dir(out, plan.arch) / TRAINED_WEIGHTS.format(round=plan.round))
                trials += 1
            previous = plan
    finally:
        leave_node(group)
    return trials

