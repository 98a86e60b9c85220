"""Which HPC ruleset a submission was made under, detected from its logs when not given.

The rule files of HPC 1.0.0 and 2.0.0 are the same but their RCP data differ, and 3.0.0 adds
openfold and lets staging come before run_start; so a log says its round by its benchmark, its
staging order and the date of its run_start (a run that started after a round's results were
published cannot belong to that round). A submission takes the newest round any of its logs
points at: rounds reuse older logs (v3.0 holds runs from 2021), never newer ones.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from .logparse import LogSniff

# (ruleset, day its results were published); runs started before that day may belong to it.
ROUND_PUBLISHED: tuple[tuple[str, datetime.date], ...] = (
    ("1.0.0", datetime.date(2021, 11, 17)),
    ("2.0.0", datetime.date(2022, 11, 9)),
)
LATEST = "3.0.0"
BENCHMARK_SINCE = {"openfold": "3.0.0"}
STAGING_BEFORE_RUN_START_SINCE = "3.0.0"


@dataclass(frozen=True)
class RulesetChoice:
    ruleset: str
    reason: str
    """How it was chosen, for the report: "--ruleset" or what in the logs decided it."""


def _key(ruleset: str) -> tuple[int, ...]:
    return tuple(int(p) for p in ruleset.split("."))


def ruleset_of_log(sniff: LogSniff) -> tuple[str, str] | None:
    """(earliest ruleset this log fits, why), or None when the log says nothing."""
    found: list[tuple[str, str]] = []
    if sniff.run_start_ms is not None:
        try:
            day = datetime.datetime.fromtimestamp(sniff.run_start_ms / 1000, datetime.timezone.utc).date()
        except (OverflowError, OSError, ValueError):
            day = None
        if day is not None:
            rounds = [r for r, published in ROUND_PUBLISHED if day < published]
            found.append((rounds[0] if rounds else LATEST, f"a run started on {day.isoformat()}"))
    if sniff.benchmark in BENCHMARK_SINCE:
        found.append((BENCHMARK_SINCE[sniff.benchmark], f"benchmark {sniff.benchmark}"))
    if sniff.staging_before_run_start:
        found.append((STAGING_BEFORE_RUN_START_SINCE, "staging before run_start"))
    return max(found, key=lambda f: _key(f[0])) if found else None


def detect_ruleset(sniffs: Sequence[LogSniff], known: Sequence[str], default: str) -> RulesetChoice:
    """The newest ruleset any log points at, among the `known` ones; `default` if none says."""
    votes = [v for v in (ruleset_of_log(s) for s in sniffs) if v is not None]
    usable = [v for v in votes if v[0] in known]
    if not usable:
        return RulesetChoice(default, f"no log tells its round; using {default}")
    ruleset, why = max(usable, key=lambda v: (_key(v[0]), v[1]))  # among dates: the newest
    return RulesetChoice(ruleset, f"detected from the logs ({why})")
