"""CosmoFlow (MLPerf HPC): 3D CNN regression of four cosmology parameters, target MAE 0.124."""

from pathlib import Path

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract.catalog import BenchmarkInfo, Target

BENCHMARK = BenchmarkInfo(
    name="cosmoflow",
    config_class=CosmoFlowConfig,
    configs_dir=Path(__file__).parent / "configs",
    target=Target(metric="eval_error", direction="min"),
    strong_run_count=10,
    functions="mlhpc.benchmarks.cosmoflow.functions:FUNCTIONS",
    memory_format="channels_last_3d",  # cuDNN's fast layout for 3D convolutions
    # oneDNN's too: 1.2-1.4x faster steps on a CPU, full and mini (perf/RESULTS.md, 2026-11-29)
    cpu_memory_format="channels_last_3d",
)
