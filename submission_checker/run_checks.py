"""Checks over analysed result files: per file (parse, timing, status, compliance) and per entry.

A problem in one file is a warning: the run is dropped and olympic scoring may absorb it. The
entry-level checks (seeds, scale, whether a score is left) decide what is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .compliance import LogAnalysis
from .findings import (
    RULE_COMPLIANCE,
    RULE_INSTANCE_SCALE,
    RULE_LOG_PARSE,
    RULE_RUN_START_STOP,
    RULE_RUN_STATUS,
    RULE_SCORE,
    RULE_SEED,
    Finding,
    error,
    warning,
)
from .scoring import MAX_DROPPED_RUNS, RunTiming

# Enough bad lines to see the pattern; a thousand of them help nobody.
MAX_PARSE_FINDINGS = 5


def check_log_file(analysis: LogAnalysis) -> list[Finding]:
    """Everything wrong with one result file, as warnings; the file's run is dropped if any."""
    path, log = analysis.path, analysis.log
    if log is None:
        return [warning(path, RULE_LOG_PARSE, m.text, m.line) for m in analysis.messages]
    if not log.mllog_lines:
        what = "binary data (NUL bytes)" if log.binary else "no ':::MLLOG ' line"
        return [warning(path, RULE_LOG_PARSE, f"not an MLPerf log: {what}; the run is dropped")]
    findings: list[Finding] = []
    if log.binary:
        findings.append(warning(path, RULE_LOG_PARSE, "holds NUL bytes (binary data)"))
    for line, problem in log.parse_errors[:MAX_PARSE_FINDINGS]:
        findings.append(warning(path, RULE_LOG_PARSE, f"bad :::MLLOG line: {problem}", line))
    if len(log.parse_errors) > MAX_PARSE_FINDINGS:
        more = len(log.parse_errors) - MAX_PARSE_FINDINGS
        findings.append(warning(path, RULE_LOG_PARSE, f"{more} more bad :::MLLOG line(s)"))
    if log.run_start_ms is None or log.run_stop_ms is None:
        missing = " and ".join(
            k for k, v in (("run_start", log.run_start_ms), ("run_stop", log.run_stop_ms)) if v is None
        )
        message = f"no {missing}: the run has no time to train (truncated log?)"
        findings.append(warning(path, RULE_RUN_START_STOP, message))
    if log.run_stop_ms is not None and log.run_stop_status != "success":
        status = "no status" if log.run_stop_status is None else f"status {log.run_stop_status!r}"
        message = f"run_stop has {status}; a converged run logs status 'success'"
        findings.append(warning(path, RULE_RUN_STATUS, message, log.run_stop_line))
    for m in analysis.messages:
        findings.append(warning(path, RULE_COMPLIANCE, m.text, m.line))
    return findings


def run_timing(analysis: LogAnalysis) -> RunTiming:
    log = analysis.log
    return RunTiming(
        file=analysis.path,
        run_start_ms=None if log is None else log.run_start_ms,
        run_stop_ms=None if log is None else log.run_stop_ms,
        compliant=analysis.compliant,
    )


def check_seeds(analyses: Sequence[LogAnalysis]) -> list[Finding]:
    """Runs of one entry must not share a seed (checked only where seeds are logged)."""
    first_seen: dict[str, str] = {}
    findings: list[Finding] = []
    for analysis in analyses:
        if analysis.log is None:
            continue
        reported: set[str] = set()
        for seed, line in analysis.log.seeds:
            if seed in reported:
                continue  # one run may log its seed more than once
            reported.add(seed)
            if seed in first_seen:
                other = Path(first_seen[seed]).name
                message = f"seed {seed} is also the seed of {other}; give every run its own seed"
                findings.append(error(analysis.path, RULE_SEED, message, line))
            else:
                first_seen[seed] = analysis.path
    return findings


def check_instance_scale(entry_path: Path, analyses: Sequence[LogAnalysis]) -> list[Finding]:
    """Weak scaling: every counted model runs on the same number of accelerators."""
    scales = {
        a.log.instance_scale
        for a in analyses
        if a.compliant and a.log is not None and a.log.instance_scale is not None
    }
    if len(scales) <= 1:
        return []
    listed = ", ".join(str(s) for s in sorted(scales))
    message = f"models use different numbers of accelerators ({listed}); weak scaling needs one size"
    return [error(entry_path, RULE_INSTANCE_SCALE, message)]


def check_strong_score(entry_path: Path, runs: Sequence[RunTiming]) -> list[Finding]:
    dropped = [Path(r.file).name for r in runs if not r.counts]
    if len(dropped) <= MAX_DROPPED_RUNS:
        return []
    message = (
        f"no score: {len(dropped)} runs dropped ({', '.join(dropped)}), olympic scoring "
        f"drops at most {MAX_DROPPED_RUNS}; fix or rerun them"
    )
    return [error(entry_path, RULE_SCORE, message)]


def check_weak_score(entry_path: Path, runs: Sequence[RunTiming], required: int | None) -> list[Finding]:
    counted = sum(r.counts for r in runs)
    if required is None or counted >= required:
        return []
    message = f"no score: {counted} compliant model(s), weak scaling needs at least {required}"
    return [error(entry_path, RULE_SCORE, message)]
