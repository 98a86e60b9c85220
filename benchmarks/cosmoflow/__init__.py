"""CosmoFlow (MLPerf HPC): 3D CNN regression of four cosmology parameters, target MAE 0.124."""

from pathlib import Path

from mlhpc.benchmarks.cosmoflow import data, model, train
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.registry import Benchmark, Target, register

COSMOFLOW = register(
    Benchmark(
        name="cosmoflow",
        config_class=CosmoFlowConfig,
        configs_dir=Path(__file__).parent / "configs",
        target=Target(metric="eval_error", direction="min"),
        strong_run_count=10,
        generate=data.generate,
        validate_dataset=data.validate_dataset,
        build_model=model.build_model,
        build_data=data.build_data,
        build_optimizer=train.build_optimizer,
        compute_loss=train.compute_loss,
        evaluate=data.evaluate,
        hyperparameters=train.hyperparameters,
        memory_format="channels_last_3d",  # cuDNN's fast layout for 3D convolutions
    )
)
