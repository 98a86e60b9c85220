"""DeepCAM (MLPerf HPC): DeepLabv3+ segmentation of cyclones and atmospheric rivers, target IoU 0.82."""

from pathlib import Path

from mlhpc.benchmarks.deepcam import data, model, train
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.common.registry import Benchmark, Target, register

DEEPCAM = register(
    Benchmark(
        name="deepcam",
        config_class=DeepCamConfig,
        configs_dir=Path(__file__).parent / "configs",
        target=Target(metric="eval_accuracy", direction="max"),
        strong_run_count=5,
        generate=data.generate,
        validate_dataset=data.validate_dataset,
        build_model=model.build_model,
        build_data=data.build_data,
        build_optimizer=train.build_optimizer,
        compute_loss=train.compute_loss,
        evaluate=data.evaluate,
        hyperparameters=train.hyperparameters,
        default_division=train.default_division,
        memory_format="channels_last",  # NHWC, as NVIDIA's DeepCAM submissions train it
    )
)
