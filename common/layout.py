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


def system_json_path(submitter_dir: Path, system: str) -> Path:
    return Path(submitter_dir) / "systems" / f"{system}.json"


def results_root(submitter_dir: Path) -> Path:
    """The organisation's results/ folder: what makes a folder an organisation's."""
    return Path(submitter_dir) / "results"


def results_dir(submitter_dir: Path, system: str, scaling: Scaling, benchmark: str) -> Path:
    return results_root(submitter_dir) / system / scaling / benchmark


def result_file(submitter_dir: Path, system: str, scaling: Scaling, benchmark: str, index: int) -> Path:
    return results_dir(submitter_dir, system, scaling, benchmark) / f"result_{index}.txt"


def breakdown_file(submitter_dir: Path, system: str, scaling: Scaling, benchmark: str, index: int) -> Path:
    """A run's time breakdown (JSON), kept beside the submission, not inside its results/ tree."""
    folder = Path(submitter_dir)
    return folder.parent / "breakdown" / folder.name / system / scaling / benchmark / f"result_{index}.json"


def result_of_breakdown(breakdown: Path) -> Path | None:
    """The result log a breakdown file (`breakdown_file`) belongs to, by the layout alone;
    None for a path that is not in a breakdown/ tree."""
    parts = Path(breakdown).parts
    if len(parts) < 6 or parts[-6] != "breakdown":
        return None
    root = Path(*parts[:-6]) if len(parts) > 6 else Path(".")
    submitter, system, scaling, benchmark = parts[-5:-1]
    return results_root(root / submitter) / system / scaling / benchmark / Path(parts[-1]).with_suffix(".txt").name


def implementations_dir(submitter_dir: Path, benchmark: str) -> Path:
    return Path(submitter_dir) / "benchmarks" / benchmark / "implementations"


def implementation_dir(submitter_dir: Path, benchmark: str, implementation: str = "pytorch") -> Path:
    return implementations_dir(submitter_dir, benchmark) / implementation
