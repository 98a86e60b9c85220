"""A toy benchmark for the loop's tests: linear regression with a few parameters, data in memory.

It goes through the real loop, the real torch loaders (DistributedSampler shards) and real DDP;
only the model and the data are small. It has the two halves of any benchmark, a torch-free
catalog entry (TOY_INFO) and its functions (FUNCTIONS), bound together as TOY; no entry point
declares it, so only a test that registers it can get it by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.config import from_dict
from mlhpc.common.contract.registry import Benchmark, BenchmarkFunctions, BenchmarkInfo, DataBundle, Target
from mlhpc.common.training.batches import to_device
from mlhpc.common.training.loaders import torch_data_bundle
from mlhpc.common.training.loop import StagedData, SubmissionInfo, train_to_target
from mlhpc.common.training.loop_config import LoopConfig
from mlhpc.common.training.mllogger import MLLog
from mlhpc.common.training.progress import SILENT, Progress
from mlhpc.common.training.schedules import WarmupSchedule, build_lr_scheduler
from mlhpc.common.vocabulary import Staging

FEATURES = 8


@dataclass(kw_only=True, frozen=True)
class ToyData:
    train_samples: int = 64
    eval_samples: int = 16
    nan_samples: int = 0
    """The first this many training samples are NaN (a loss that goes non-finite)."""


@dataclass(kw_only=True, frozen=True)
class ToyOptimizer:
    lr: float = 0.05
    milestones: tuple[int, ...] = ()
    """Optimizer steps at which the LR is multiplied by 0.1."""


@dataclass(kw_only=True, frozen=True)
class ToyConfig:
    loop: LoopConfig
    data: ToyData = field(default_factory=ToyData)
    optimizer: ToyOptimizer = field(default_factory=ToyOptimizer)
    hidden: int = 0
    """0: one linear layer; else a hidden layer of this width (for timing a bigger step)."""


def make_config(**settings: Any) -> ToyConfig:
    """A ToyConfig: `name=value` sets loop.name, `data__name=value` data.name (and optimizer__,
    hidden); the rest keeps its defaults (global batch 8, 3 epochs, an unreachable target)."""
    raw: dict[str, Any] = {"loop": {"global_batch_size": 8, "max_epochs": 3, "target": 0.0}}
    for key, value in settings.items():
        section, _, name = key.rpartition("__")
        if key == "hidden":
            raw["hidden"] = value
        else:
            raw.setdefault(section or "loop", {})[name] = value
    return from_dict(ToyConfig, raw)


def _true_weights() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, FEATURES)


def _dataset(samples: int, seed: int, nan_samples: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    y = x @ _true_weights() + 0.01 * torch.randn(samples, generator=generator)
    x[:nan_samples] = float("nan")
    return TensorDataset(x, y[:, None])


def build_model(cfg: ToyConfig) -> torch.nn.Module:
    if cfg.hidden:
        return torch.nn.Sequential(
            torch.nn.Linear(FEATURES, cfg.hidden), torch.nn.ReLU(), torch.nn.Linear(cfg.hidden, 1)
        )
    return torch.nn.Linear(FEATURES, 1)


def build_data(cfg: ToyConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    return torch_data_bundle(
        _dataset(cfg.data.train_samples, 1, cfg.data.nan_samples),
        _dataset(cfg.data.eval_samples, 2),
        loop=cfg.loop,
        ctx=ctx,
        seed=seed,
        num_workers=0,
        where=data_dir,
    )


def build_optimizer(
    cfg: ToyConfig, model: torch.nn.Module, ctx: DistContext, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr)
    schedule = WarmupSchedule(kind="multistep", milestones=cfg.optimizer.milestones, decay_rate=0.1)
    return optimizer, build_lr_scheduler(optimizer, schedule)


def compute_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x).float(), y)


def evaluate(model: torch.nn.Module, loader: Any, ctx: DistContext) -> float:
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for batch in loader:
        x, y = to_device(batch, ctx.device)
        totals[0] += F.mse_loss(model(x).float(), y, reduction="sum").double()
        totals[1] += y.numel()
    ctx.all_reduce_sum(totals)
    return (totals[0] / totals[1].clamp(min=1)).item()


def hyperparameters(cfg: ToyConfig, ctx: DistContext) -> dict[str, Any]:
    return {"global_batch_size": cfg.loop.global_batch_size, "opt_base_learning_rate": cfg.optimizer.lr}


TOY_INFO = BenchmarkInfo(
    name="toy",
    config_class=ToyConfig,
    configs_dir=Path(__file__).parent,
    target=Target(metric="eval_error", direction="min"),
    strong_run_count=1,
    functions="tests.helpers.toy_benchmark:FUNCTIONS",
)
"""The toy's catalog entry: the facts, importable without torch in a real benchmark's package."""

FUNCTIONS = BenchmarkFunctions(
    generate=lambda *args, **kwargs: None,
    validate_dataset=lambda *args, **kwargs: None,
    build_model=build_model,
    build_data=build_data,
    build_optimizer=build_optimizer,
    compute_loss=compute_loss,
    evaluate=evaluate,
    hyperparameters=hyperparameters,
)
"""The toy's torch side, which `registry.get` would bind to TOY_INFO."""

TOY = Benchmark.bind(TOY_INFO, FUNCTIONS)

SUBMISSION = SubmissionInfo(submitter="tests", system="toy")


def run_toy(
    cfg: ToyConfig,
    ctx: DistContext,
    log_path: Path | None,
    *,
    seed: int = 1,
    staging: Staging = "inside",
    bench: Benchmark = TOY,
    data_dir: Path | None = None,
    progress: Progress = SILENT,
) -> Any:
    """train_to_target on the toy (or `bench`, reading `data_dir` where it is: staging is a no-op);
    the MLLOG file at `log_path` (rank 0), or no log when None."""
    log = MLLog(log_path, enabled=ctx.is_main and log_path is not None, echo=False)
    staging_dir = data_dir or (Path(log_path).parent if log_path is not None else Path("."))
    try:
        result = train_to_target(
            bench,
            cfg,
            ctx,
            log,
            seed=seed,
            submission=SUBMISSION,
            stage=lambda: StagedData(path=staging_dir, metadata={"staged_files": 0}),
            staging=staging,
            progress=progress,
        )
    except BaseException:
        log.discard()
        raise
    log.close()
    return result


_COUNT_COLLECTIVES = """
import json, sys
from pathlib import Path
from torch.profiler import ProfilerActivity, profile
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
from tests.helpers.toy_benchmark import make_config, run_toy

ctx = init_distributed("gloo", "cpu")
counts = {}
for setting in json.loads(sys.argv[2]):
    cfg = make_config(**setting)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_toy(cfg, ctx, None)
    counts[json.dumps(setting)] = sum(e.name.startswith("gloo:") for e in prof.events())
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(counts))
shutdown_distributed()
"""


def collectives_script() -> str:
    """A script for torchrun: `script OUT SETTINGS_JSON` writes each rank's count of gloo collectives
    in one toy run per setting to OUT/rank<r>.json."""
    return _COUNT_COLLECTIVES
