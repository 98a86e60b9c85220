"""Extreme weather (HPC AI500): Faster R-CNN boxes on 16-channel CAM5 fields, target mAP@0.5 = 0.35."""

from pathlib import Path

from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.contract.catalog import BenchmarkInfo, Target

BENCHMARK = BenchmarkInfo(
    name="extreme_weather",
    config_class=ExtremeWeatherConfig,
    configs_dir=Path(__file__).parent / "configs",
    target=Target(metric="eval_accuracy", direction="max"),
    strong_run_count=5,  # as mlperf_logging asks of deepcam and oc20
    functions="mlhpc.benchmarks.extreme_weather.functions:FUNCTIONS",
    # mlperf_logging has no rules for it: HPC 3.0.0's common rules plus ours.
    rules_file=Path(__file__).parent / "closed_extreme_weather.yaml",
)
