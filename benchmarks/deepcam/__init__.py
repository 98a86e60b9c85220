"""DeepCAM (MLPerf HPC): DeepLabv3+ segmentation of cyclones and atmospheric rivers, target IoU 0.82."""

from pathlib import Path

from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.common.contract.catalog import BenchmarkInfo, Target
from mlhpc.common.vocabulary import Division

# The closed rules (hpc_3.0.0/closed_deepcam.yaml) require the real dataset's sample counts.
REAL_TRAIN_SAMPLES = 121_266
REAL_EVAL_SAMPLES = 15_158


def default_division(cfg: DeepCamConfig) -> Division:
    """closed for the real dataset's sizes; open for smaller ones (mini), which closed rules refuse."""
    real = (cfg.data.num_train_samples, cfg.data.num_eval_samples) == (REAL_TRAIN_SAMPLES, REAL_EVAL_SAMPLES)
    return "closed" if real else "open"


BENCHMARK = BenchmarkInfo(
    name="deepcam",
    config_class=DeepCamConfig,
    configs_dir=Path(__file__).parent / "configs",
    target=Target(metric="eval_accuracy", direction="max"),
    strong_run_count=5,
    functions="mlhpc.benchmarks.deepcam.functions:FUNCTIONS",
    default_division=default_division,
    memory_format="channels_last",  # NHWC, as NVIDIA's DeepCAM submissions train it
)
