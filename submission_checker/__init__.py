"""Validate and score an MLPerf HPC submission folder (no torch: runs on a login node).

`check_submission(path)` returns a `CheckReport`; `check_command` is what `mlhpc check` runs.
"""

from .check import check_submission, score_entry
from .command import check_command
from .compliance import DEFAULT_RULESET, analyse_logs, known_rulesets
from .findings import Finding
from .report import CheckReport, EntryReport, RunReport
from .scoring import (
    RunTiming,
    WeakScore,
    apply_scaling_factor,
    models_per_minute,
    olympic_mean,
    strong_score,
    time_to_train_min,
    weak_score,
)

__all__ = [
    "DEFAULT_RULESET",
    "CheckReport",
    "EntryReport",
    "Finding",
    "RunReport",
    "RunTiming",
    "WeakScore",
    "analyse_logs",
    "apply_scaling_factor",
    "check_command",
    "check_submission",
    "known_rulesets",
    "models_per_minute",
    "olympic_mean",
    "score_entry",
    "strong_score",
    "time_to_train_min",
    "weak_score",
]
