"""AIPerf's torch side as the catalog's other tools see it: its data, and its seed network as a
model (what `mlhpc generate`, `mlhpc doctor` and `mlhpc characterize` work with). A run itself
is a search (experiment.py, launched by mlhpc/campaign/automl.py), not the shared loop. No sample_bytes: a JPEG's size depends on the image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.benchmarks.aiperf.data import build_loaders, validate_imagenet
from mlhpc.benchmarks.aiperf.graph import Graph
from mlhpc.benchmarks.aiperf.net import build_model as graph_model
from mlhpc.benchmarks.aiperf.seed import resnet
from mlhpc.benchmarks.aiperf.synthetic import generate_imagenet
from mlhpc.common.contract.registry import BenchmarkFunctions, DataBundle
from mlhpc.dataset_size import split_counts


def seed_graph(cfg: AIPerfConfig, classes: int | None = None) -> Graph:
    """The network the search starts from, for the config's image size and `classes`."""
    size = cfg.data.image_size
    return resnet(
        (size, size, 3), classes or cfg.data.classes, blocks=tuple(cfg.seed.blocks), width=cfg.seed.width,
        stem=cfg.seed.stem,
    )


def generate(cfg: AIPerfConfig, out_dir: Path, num_samples: int | None = None, seed: int = 0) -> None:
    train, val = split_counts(cfg.data, num_samples)
    generate_imagenet(
        Path(out_dir),
        classes=cfg.data.classes,
        train_per_class=max(1, train // cfg.data.classes),
        val_per_class=max(1, val // cfg.data.classes),
        resolution=cfg.data.resolution,
        seed=seed,
        mislabeled_percent=cfg.data.mislabeled_percent,
    )


def validate_dataset(cfg: AIPerfConfig, data_dir: Path) -> None:
    validate_imagenet(Path(data_dir))


def build_model(cfg: AIPerfConfig) -> torch.nn.Module:
    return graph_model(seed_graph(cfg))


def build_data(cfg: AIPerfConfig, data_dir: Path, ctx: Any, seed: int) -> DataBundle:
    index = validate_imagenet(Path(data_dir))
    batch = max(1, cfg.search.batch_sizes[0] // ctx.world_size)
    train, val = build_loaders(
        index, image_size=cfg.data.image_size, batch_size=batch, rank=ctx.rank, world_size=ctx.world_size,
        seed=seed, workers=cfg.data.num_workers,
    )
    return DataBundle(
        train=train, validation=val, train_samples=len(index.train), eval_samples=len(index.val),
        set_epoch=train.sampler.set_epoch,
    )


def build_optimizer(cfg: AIPerfConfig, model: torch.nn.Module, ctx: Any, steps_per_epoch: int) -> Any:
    opt = cfg.optimizer
    batch = cfg.search.batch_sizes[0]
    optimizer = torch.optim.SGD(
        model.parameters(), lr=opt.base_learning_rate * batch / opt.base_batch_size, momentum=opt.momentum,
        nesterov=True, weight_decay=opt.weight_decay,
    )
    steps = max(1, steps_per_epoch * cfg.search.epochs[0])
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)


def compute_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Any, ctx: Any) -> float:
    import torch.distributed as dist

    model.eval()
    device = next(model.parameters()).device
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(dim=1) == labels).sum()
        counts[1] += labels.numel()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts)
    return float(counts[0] / counts[1]) if counts[1] else 0.0


def hyperparameters(cfg: AIPerfConfig, ctx: Any) -> dict[str, Any]:
    return {
        "global_batch_size": cfg.search.batch_sizes[0],
        "opt_name": "sgd",
        "opt_base_learning_rate": cfg.optimizer.base_learning_rate,
    }


def example_batch(cfg: AIPerfConfig, batch_size: int, device: torch.device) -> Any:
    size = cfg.data.image_size
    images = torch.randn(batch_size, 3, size, size, device=device)
    labels = torch.randint(0, cfg.data.classes, (batch_size,), device=device)
    return images, labels


FUNCTIONS = BenchmarkFunctions(
    generate=generate,
    validate_dataset=validate_dataset,
    build_model=build_model,
    build_data=build_data,
    build_optimizer=build_optimizer,
    compute_loss=compute_loss,
    evaluate=evaluate,
    hyperparameters=hyperparameters,
    example_batch=example_batch,
)
