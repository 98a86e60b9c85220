"""CosmoFlow's torch side: the functions the shared loop calls, bound to its catalog entry by
`registry.get("cosmoflow")`."""

from pathlib import Path

from mlhpc.benchmarks.cosmoflow import dali, data, model, train
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.registry import BenchmarkFunctions, DataBundle
from mlhpc.common.training.dali import choose_loader


def build_data(cfg: CosmoFlowConfig, data_dir: Path, ctx: DistContext, seed: int) -> DataBundle:
    """The loaders data.loader names: DALI's pipeline (dali.py) or torch's DataLoader (data.py)."""
    if choose_loader(cfg.data.loader, ctx) == "dali":
        return dali.build_dali_data(cfg, data_dir, ctx, seed)
    return data.build_torch_data(cfg, data_dir, ctx, seed)


FUNCTIONS = BenchmarkFunctions(
    generate=data.generate,
    validate_dataset=data.validate_dataset,
    build_model=model.build_model,
    build_data=build_data,
    build_optimizer=train.build_optimizer,
    compute_loss=train.compute_loss,
    evaluate=data.evaluate,
    hyperparameters=train.hyperparameters,
)
