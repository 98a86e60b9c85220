"""The MLPerf HPC submission directory layout, shared by the runner and the checker (no torch).

<root>/<submitter>/systems/<system>.json
<root>/<submitter>/results/<system>/{strong,weak}/<benchmark>/result_<i>.txt
<root>/<submitter>/benchmarks/<benchmark>/implementations/<implementation>/
<root>/breakdown/<submitter>/<system>/{strong,weak}/<benchmark>/result_<i>.json  (mlhpc's own)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Scaling = Literal["strong", "weak"]
SCALINGS: tuple[Scaling, ...] = ("strong", "weak")

# Fields the official package checker requires in a system description.
SYSTEM_REQUIRED_FIELDS: tuple[str, ...] = (
    "submitter",
    "division",
    "status",
    "system_name",
    "number_of_nodes",
    "host_processor_model_name",
    "host_processors_per_node",
    "accelerator_model_name",
    "accelerators_per_node",
    "framework",
    "hw_notes",
    "sw_notes",
)

# Runs a score needs for benchmarks that mlperf_logging does not know; the MLPerf HPC
# ones (cosmoflow 10, deepcam 5, oc20 5, openfold 10) come from mlperf_logging itself.
OWN_RESULT_COUNTS: dict[str, int] = {"extreme_weather": 5}


def required_run_count(benchmark: str) -> int | None:
    """Runs a strong-scaling score needs (weak: at least this many models); None if unknown."""
    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    counts = {**_ALL_RESULT_FILE_COUNTS["hpc"], **OWN_RESULT_COUNTS}
    return counts.get(benchmark)


def system_json_path(org_dir: Path, system: str) -> Path:
    return Path(org_dir) / "systems" / f"{system}.json"


def results_dir(org_dir: Path, system: str, scaling: Scaling, benchmark: str) -> Path:
    return Path(org_dir) / "results" / system / scaling / benchmark


def result_file(org_dir: Path, system: str, scaling: Scaling, benchmark: str, index: int) -> Path:
    return results_dir(org_dir, system, scaling, benchmark) / f"result_{index}.txt"


def breakdown_file(org_dir: Path, system: str, scaling: Scaling, benchmark: str, index: int) -> Path:
    """A run's time breakdown (JSON), kept beside the submission, not inside its results/ tree."""
    org_dir = Path(org_dir)
    return org_dir.parent / "breakdown" / org_dir.name / system / scaling / benchmark / f"result_{index}.json"


def implementation_dir(org_dir: Path, benchmark: str, implementation: str = "pytorch") -> Path:
    return Path(org_dir) / "benchmarks" / benchmark / "implementations" / implementation
