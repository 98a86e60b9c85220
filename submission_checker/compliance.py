"""Per-file work: the official `mlperf_logging` compliance engine plus `parse_log`, over a pool.

The engine keeps module-level state (its queue of rule files) and logs through the root logger,
so each file runs with that queue emptied and those records dropped; files run in spawned worker
processes when there are enough of them to pay for starting the workers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import SubmissionError

from .logparse import RunLog, find_line, parse_log

USAGE = "hpc"
DEFAULT_RULESET = "3.0.0"
# Below this many files, starting worker processes costs more than it saves (measured on
# 2 cores: 30 files 0.97 s serial vs 1.32 s pooled; 108 files 3.4 s vs 2.8 s).
MIN_FILES_FOR_POOL = 48

_log = logging.getLogger(__name__)
_FAILED_IN_LINE = re.compile(r"failed in line (\d+)")


@dataclass(frozen=True)
class ComplianceMessage:
    line: int | None
    """1-based file line the engine's message points at, when it names one."""
    text: str


@dataclass(frozen=True)
class LogAnalysis:
    """Everything the checker learns from one result file."""

    path: str
    compliant: bool
    """The official engine passed it and every `:::MLLOG` line decoded (the summarizer's test)."""
    messages: tuple[ComplianceMessage, ...]
    """The engine's messages, shortened; a crash of the engine is one of them."""
    log: RunLog | None
    """None when the file could not be read at all (then `messages` says why)."""


def known_rulesets() -> list[str]:
    """The HPC rulesets the installed mlperf_logging has rule files for."""
    import mlperf_logging.compliance_checker as cc

    folder = Path(cc.__file__).parent
    return sorted(p.name.split("_", 1)[1] for p in folder.glob(f"{USAGE}_*.*.*") if p.is_dir())


def validate_ruleset(ruleset: str) -> str:
    known = known_rulesets()
    if ruleset not in known:
        raise SubmissionError(f"unknown HPC ruleset {ruleset!r}; known: {', '.join(known)}")
    return ruleset


class _DropEngineRecords(logging.Filter):
    """Drops the engine's own log records (it prints every message it collects)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "mlperf_logging" not in record.pathname


@contextlib.contextmanager
def _quiet_engine() -> Iterator[None]:
    root = logging.getLogger()
    # A root handler stops logging.warning() from calling basicConfig() behind our back.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    drop = _DropEngineRecords()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if guard is not None:
            root.removeHandler(guard)


def _shorten(message: str, path: str, log: RunLog | None) -> ComplianceMessage:
    """One engine message without its context dumps, pointed at the file line it names."""
    kept: list[str] = []
    quoted: str | None = None
    for text in message.strip().splitlines():
        if text.startswith("current context") or text.startswith("current line"):
            break
        if text.startswith(":::MLLOG"):
            quoted = quoted or text
            continue
        kept.append(text.strip())
    line: int | None = None
    found = _FAILED_IN_LINE.search(message)
    if found and log is not None and int(found.group(1)) < len(log.mllog_lines):
        line = log.mllog_lines[int(found.group(1))]
    elif quoted is not None:
        line = find_line(path, quoted)
    text = " ".join(t for t in kept if t)
    text = _FAILED_IN_LINE.sub("failed", text).replace(": failed test:", "; failed test:")
    return ComplianceMessage(line, " ".join(text.split()))


def run_engine(path: str, ruleset: str, log: RunLog | None = None) -> tuple[bool, list[ComplianceMessage]]:
    """Run the official checker on one file: (passed, its messages)."""
    from mlperf_logging.compliance_checker import mlp_compliance

    mlp_compliance.enqueued_configs.clear()
    checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=True, werror=False)
    try:
        with _quiet_engine():
            valid = checker.check_file(path, f"{USAGE}_{ruleset}/common.yaml")
    except Exception as e:  # the engine raises on some malformed records; that is a finding
        text = f"the official compliance checker stopped on this file: {type(e).__name__}: {e}"
        return False, [ComplianceMessage(None, text)]
    finally:
        mlp_compliance.enqueued_configs.clear()
    raw = [*checker.overwritable.values(), *checker.not_overwritable]
    return bool(valid), [_shorten(m, path, log) for m in raw]


def analyse_log(path: str, ruleset: str) -> LogAnalysis:
    """Parse one result file and run the official compliance checker on it; never raises."""
    try:
        log = parse_log(path)
    except OSError as e:
        message = ComplianceMessage(None, f"cannot read the file: {e.strerror or e}")
        return LogAnalysis(path, False, (message,), None)
    except Exception as e:  # a hostile file must become a finding, not a crash of the whole check
        message = ComplianceMessage(None, f"cannot parse the file: {type(e).__name__}: {e}")
        return LogAnalysis(path, False, (message,), None)
    valid, messages = run_engine(path, ruleset, log)
    compliant = valid and not log.parse_errors
    return LogAnalysis(path, compliant, tuple(messages), log)


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def analyse_logs(
    paths: Sequence[Path | str],
    ruleset: str,
    jobs: int | None = None,
    *,
    min_files_for_pool: int = MIN_FILES_FOR_POOL,
) -> dict[str, LogAnalysis]:
    """`analyse_log` for every path, in spawned worker processes when it pays; keyed by path.

    A script calling this (or `check_submission`) with more than one job must do so under
    `if __name__ == "__main__":`, as for any spawned pool; if the workers fail it runs serially.
    """
    names = [str(p) for p in paths]
    workers = min(jobs or _default_jobs(), len(names))
    if workers <= 1 or len(names) < min_files_for_pool:
        return {name: analyse_log(name, ruleset) for name in names}
    chunk = max(1, len(names) // (workers * 4))
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(analyse_log, names, [ruleset] * len(names), chunksize=chunk))
    except concurrent.futures.process.BrokenProcessPool as e:
        # Typically a script that calls us without `if __name__ == "__main__":` (spawn re-runs it).
        _log.warning("compliance worker processes failed (%s); checking in this process", e)
        return {name: analyse_log(name, ruleset) for name in names}
    return dict(zip(names, results, strict=True))
