"""AIPerf: AutoML (network morphism + TPE) as a whole-machine benchmark, scored by analytic OPS.

Peng Cheng Laboratory and Tsinghua's AIPerf ("AIPerf: Automated Machine Learning as an AI-HPC
Benchmark", Big Data Mining and Analytics 4(3), 2021): one trial a node for as long as the run
lasts, its score the operations the trials did a second, counted by formula, times
|ln(1 - best top-1)|; valid once the best top-1 reaches the threshold (70 % on ImageNet).
"""

from pathlib import Path

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.common.contract.catalog import BenchmarkInfo, Target

BENCHMARK = BenchmarkInfo(
    name="aiperf",
    config_class=AIPerfConfig,
    configs_dir=Path(__file__).parent / "configs",
    target=Target(metric="eval_accuracy", direction="max"),
    strong_run_count=1,  # one run: it uses the whole machine for its duration
    functions="mlhpc.benchmarks.aiperf.functions:FUNCTIONS",
    memory_format="channels_last",
    workload="automl",
    runner="mlhpc.campaign.automl:run",
)
