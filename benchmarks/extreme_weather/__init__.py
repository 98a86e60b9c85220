"""Extreme weather (HPC AI500): Faster R-CNN boxes on 16-channel CAM5 fields, target mAP@0.5 = 0.35."""

from pathlib import Path

from mlhpc.benchmarks.extreme_weather import data, model, train
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.layout import OWN_RESULT_COUNTS
from mlhpc.common.registry import Benchmark, Target, register

NAME = "extreme_weather"
RULES_FILE = Path(__file__).parent / "closed_extreme_weather.yaml"
"""The mlperf_logging rule file for this benchmark (HPC 3.0.0 common rules plus ours)."""

EXTREME_WEATHER = register(
    Benchmark(
        name=NAME,
        config_class=ExtremeWeatherConfig,
        configs_dir=Path(__file__).parent / "configs",
        target=Target(metric="eval_accuracy", direction="max"),
        strong_run_count=OWN_RESULT_COUNTS[NAME],
        generate=data.generate,
        validate_dataset=data.validate_dataset,
        build_model=model.build_model,
        build_data=data.build_data,
        build_optimizer=train.build_optimizer,
        compute_loss=train.compute_loss,
        evaluate=data.evaluate,
        hyperparameters=train.hyperparameters,
        run_end_events=train.run_end_events,
    )
)
