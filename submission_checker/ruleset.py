"""Which HPC ruleset a submission was made under, detected from its logs when not given.

The rule files of HPC 1.0.0 and 2.0.0 are the same but their RCP data differ, and 3.0.0 adds
openfold and lets staging come before run_start; so a log says its round by its benchmark, its
staging order and the date of its run_start (a run that started after a round's results were
published cannot belong to that round). The logs give the earliest round the submission can
belong to (the newest round any log points at): rounds reuse older logs (v3.0 holds runs from 2021),
never newer ones. A folder named for a round (`hpc_results_v3.0`, `v2.0`) decides among the rounds
the logs allow; the reason names every signal and which one decided.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mlhpc.common.vocabulary import LATEST_RULESET as LATEST
from mlhpc.common.vocabulary import STAGING_BEFORE_RUN_START_SINCE, ruleset_key

from .logparse import LogSniff

# (ruleset, day its results were published); runs started before that day may belong to it.
ROUND_PUBLISHED: tuple[tuple[str, datetime.date], ...] = (
    ("1.0.0", datetime.date(2021, 11, 17)),
    ("2.0.0", datetime.date(2022, 11, 9)),
)
BENCHMARK_SINCE = {"openfold": "3.0.0"}
_ROUND_IN_NAME = re.compile(r"(?:^|[^0-9a-z])v(\d+)\.(\d+)(?:\.(\d+))?(?:$|[^0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class RulesetChoice:
    ruleset: str
    reason: str
    """How it was chosen, for the report: "--ruleset" or what in the logs decided it."""


def log_signals(sniff: LogSniff) -> list[tuple[str, str]]:
    """Every (earliest ruleset this log fits, why) the log carries: its date, benchmark, staging order."""
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
    return found


def ruleset_of_folder(folder: str | None, known: Sequence[str]) -> tuple[str, str] | None:
    """(ruleset, why) when the checked folder's name names a known round ("hpc_results_v3.0")."""
    if not folder:
        return None
    found = _ROUND_IN_NAME.search(folder.rstrip("/").rsplit("/", 1)[-1])
    if found is None:
        return None
    ruleset = f"{found.group(1)}.{found.group(2)}.{found.group(3) or 0}"
    return (ruleset, f"the folder name {found.group(0).strip('_-')!r}") if ruleset in known else None


def _log_signals(votes: Sequence[tuple[str, str]]) -> str:
    """Each kind of signal once, with the round it points at: the newest date, each benchmark, staging."""
    shown: dict[str, str] = {}
    for ruleset, why in sorted(votes, key=lambda v: (ruleset_key(v[0]), v[1]), reverse=True):
        kind = "date" if why.startswith("a run started") else why
        shown.setdefault(kind, f"{why} -> {ruleset}")
    return "; ".join(shown.values())


def detect_ruleset(
    sniffs: Sequence[LogSniff], known: Sequence[str], default: str, folder: str | None = None
) -> RulesetChoice:
    """The round the logs allow (the newest any log points at), or a later one the folder's name
    names; `default` when nothing says. The reason names the signals and which decided."""
    usable = [v for sniff in sniffs for v in log_signals(sniff) if v[0] in known]
    named = ruleset_of_folder(folder, known)
    if not usable:
        if named is not None:
            return RulesetChoice(named[0], f"{named[1]} decided; no log tells its round")
        return RulesetChoice(default, f"no log tells its round; using {default}")
    earliest, why = max(usable, key=lambda v: (ruleset_key(v[0]), v[1]))  # among dates: the newest
    signals = _log_signals(usable)
    if named is None:
        return RulesetChoice(earliest, f"detected from the logs ({why}; all signals: {signals})")
    if ruleset_key(named[0]) >= ruleset_key(earliest):
        return RulesetChoice(named[0], f"{named[1]} decided; the logs allow {earliest} or later ({signals})")
    return RulesetChoice(
        earliest, f"the logs decided ({why}); {named[1]} says {named[0]}, older than they allow"
    )
