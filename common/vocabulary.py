"""The words a submission and a run choose from, each list written once (torch-free).

argparse takes its `choices` from here, the types their `Literal`s, the planner its checks and
the checker its rules, so a new ruleset or status is one edit. Each tuple is read off its
`Literal` (`typing.get_args`), so the type and the list cannot drift apart.
"""

from __future__ import annotations

from typing import Literal, get_args

Division = Literal["closed", "open"]
DIVISIONS: tuple[Division, ...] = get_args(Division)

Status = Literal["onprem", "cloud", "preview", "research"]
"""mlhpc's system status (a system description's `status`); the checker also accepts the older
rounds' words (submission_checker/claims.py)."""
STATUSES: tuple[Status, ...] = get_args(Status)

Ruleset = Literal["1.0.0", "2.0.0", "3.0.0"]
"""The MLPerf HPC rounds, oldest first."""
RULESETS: tuple[Ruleset, ...] = get_args(Ruleset)
LATEST_RULESET: Ruleset = RULESETS[-1]
DEFAULT_RULESET: Ruleset = LATEST_RULESET
"""What a campaign is run and checked under when nothing names a ruleset: the newest round."""

Staging = Literal["inside", "before", "overlap"]
"""Where staging goes: inside run_start..run_stop (timed) before training, before run_start, or
inside the run while training reads the dataset through the copy being made."""
STAGINGS: tuple[Staging, ...] = get_args(Staging)
STAGING_WHEN: dict[Staging, str] = {
    "inside": "inside the timed region, before training",
    "before": "before the timed region",
    "overlap": "inside the timed region, while training",
}
"""Each word of --staging as the campaign's plan line and its dry run say it."""
DEFAULT_STAGING: Staging = "inside"

StagingIo = Literal["auto", "buffered"]
"""The staging copy's I/O path (`mlhpc stage --io`, `mlhpc run --io`): both the one page-cache path."""
IO_CHOICES: tuple[StagingIo, ...] = get_args(StagingIo)

StagingMode = Literal["replicate", "shard", "copy"]
"""What each node ends with (`mlhpc stage --mode`): the whole dataset read once, its share, or a
copy read by every node (`staging/plan.py`). Here, below staging, so that the command line builds
its parser without importing staging."""
STAGING_MODES: tuple[StagingMode, ...] = get_args(StagingMode)

STAGING_WORKERS = 32
"""The default copy and hash threads per rank (`mlhpc stage --workers`, `mlhpc manifest
--workers`): `StageRequest.workers`'s default."""

STAGING_BEFORE_RUN_START_SINCE: Ruleset = "3.0.0"
"""The first round that lets staging come before run_start (1.0.0 and 2.0.0 time it)."""


def ruleset_key(ruleset: str) -> tuple[int, ...]:
    """`"2.0.0"` -> (2, 0, 0), for comparing rounds."""
    return tuple(int(part) for part in ruleset.split("."))


def staging_before_allowed(ruleset: str) -> bool:
    """Whether `ruleset` lets staging come before run_start (the one place this rule is written)."""
    return ruleset_key(ruleset) >= ruleset_key(STAGING_BEFORE_RUN_START_SINCE)
