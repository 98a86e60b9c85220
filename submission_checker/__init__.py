"""Validate and score an MLPerf HPC submission folder (no torch: runs on a login node).

`check_submission(path)` returns a `CheckReport`; `check_command` is what `mlhpc check` runs.
It never writes into the submission.
"""

from .check import check_submission, score_entry
from .command import check_command
from .compliance import DEFAULT_RULESET, analyse_logs, known_rulesets
from .findings import Finding
from .rcp import RcpRead, RcpResult, check_rcp
from .report import CheckReport, EntryReport, RunReport
from .ruleset import RulesetChoice, detect_ruleset
from .scoring import (
    RunTiming,
    WeakScore,
    apply_scaling_factor,
    models_per_minute,
    olympic_drops,
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
    "RcpRead",
    "RcpResult",
    "RulesetChoice",
    "RunReport",
    "RunTiming",
    "WeakScore",
    "analyse_logs",
    "apply_scaling_factor",
    "check_command",
    "check_rcp",
    "check_submission",
    "detect_ruleset",
    "known_rulesets",
    "models_per_minute",
    "olympic_drops",
    "olympic_mean",
    "score_entry",
    "strong_score",
    "time_to_train_min",
    "weak_score",
]
