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
    RULE_IMPOSSIBLE,
    RULE_INSTANCE_SCALE,
    RULE_LOG_PARSE,
    RULE_PRUNED,
    RULE_RUN_SCALE,
    RULE_RUN_START_STOP,
    RULE_RUN_STATUS,
    RULE_SCORE,
    RULE_SEED,
    RULE_SEED_MISSING,
    RULE_SEED_PRUNED,
    RULE_TIMESTAMPS,
    Finding,
    error,
    warning,
)
from .logparse import RunLog
from .scoring import MAX_DROPPED_RUNS, RunTiming, impossible_minutes, time_to_train_min

# Enough bad lines to see the pattern; a thousand of them help nobody.
MAX_PARSE_FINDINGS = 5
FIX_LOG = "rerun, or restore the file as the run wrote it"


def check_log_file(analysis: LogAnalysis) -> list[Finding]:
    """Everything wrong with one result file; the file's run is dropped if any is a warning here."""
    path, log = analysis.path, analysis.log
    if analysis.refused is not None:
        rule, message, fix = analysis.refused
        return [warning(path, rule, message, fix=fix)]
    if log is None:
        return [warning(path, RULE_LOG_PARSE, m.text, m.line, fix=FIX_LOG) for m in analysis.messages]
    if not log.mllog_lines:
        what = "binary data (NUL bytes)" if log.binary else "no ':::MLLOG ' line"
        return [warning(path, RULE_LOG_PARSE, f"not an MLPerf log: {what}; the run is dropped", fix=FIX_LOG)]
    findings: list[Finding] = []
    if log.binary:
        findings.append(warning(path, RULE_LOG_PARSE, "holds NUL bytes (binary data)", fix=FIX_LOG))
    for line, problem in log.parse_errors[:MAX_PARSE_FINDINGS]:
        findings.append(warning(path, RULE_LOG_PARSE, f"bad :::MLLOG line: {problem}", line, fix=FIX_LOG))
    if len(log.parse_errors) > MAX_PARSE_FINDINGS:
        more = len(log.parse_errors) - MAX_PARSE_FINDINGS
        findings.append(warning(path, RULE_LOG_PARSE, f"{more} more bad :::MLLOG line(s)", fix=FIX_LOG))
    findings += _timing_findings(path, log)
    for m in analysis.messages:
        fix = "log what the rule asks for (mlperf_logging compliance_checker rules of this ruleset)"
        findings.append(warning(path, RULE_COMPLIANCE, m.text, m.line, fix=fix))
    return findings


def _timing_findings(path: str, log: RunLog) -> list[Finding]:
    findings: list[Finding] = []
    if log.run_start_ms is None or log.run_stop_ms is None:
        missing = " and ".join(
            k for k, v in (("run_start", log.run_start_ms), ("run_stop", log.run_stop_ms)) if v is None
        )
        message = f"no {missing}: the run has no time to train (truncated log?)"
        findings.append(warning(path, RULE_RUN_START_STOP, message, fix=FIX_LOG))
    else:
        why = impossible_minutes(time_to_train_min(log.run_start_ms, log.run_stop_ms))
        if why is not None:
            fix = "log run_stop after training; check the clock of the logging rank"
            message = f"{why}; the run is not scored"
            findings.append(error(path, RULE_TIMESTAMPS, message, log.run_stop_line, fix=fix))
    for line, why in log.impossible[:MAX_PARSE_FINDINGS]:
        message = f"{why}: no clock gives it; the line is ignored and the run is not scored"
        findings.append(error(path, RULE_IMPOSSIBLE, message, line, fix=FIX_LOG))
    if len(log.impossible) > MAX_PARSE_FINDINGS:
        more = len(log.impossible) - MAX_PARSE_FINDINGS
        findings.append(error(path, RULE_IMPOSSIBLE, f"{more} more line(s) with an impossible time_ms"))
    if log.run_stop_ms is not None and log.run_stop_status != "success":
        status = "no status" if log.run_stop_status is None else f"status {log.run_stop_status!r}"
        message = f"run_stop has {status}; the RCP checker counts the run as not converged"
        fix = "log metadata status 'success' when the target is reached"
        findings.append(warning(path, RULE_RUN_STATUS, message, log.run_stop_line, fix=fix))
    if log.backwards is not None:
        count, line = log.backwards
        message = f"time_ms goes backwards on {count} line(s), first here"
        fix = "log from one rank, or from ranks whose clocks agree"
        findings.append(warning(path, RULE_TIMESTAMPS, message, line, fix=fix))
    return findings


def run_timing(analysis: LogAnalysis) -> RunTiming:
    log = analysis.log
    return RunTiming(
        file=analysis.path,
        run_start_ms=None if log is None else log.run_start_ms,
        run_stop_ms=None if log is None else log.run_stop_ms,
        compliant=analysis.compliant,
    )


def check_seeds(entry_path: Path, analyses: Sequence[LogAnalysis], *, closed: bool) -> list[Finding]:
    """Closed division: every run logs a seed, and no two runs of one entry share one."""
    if not closed:
        return []
    first_seen: dict[str, str] = {}
    findings: list[Finding] = []
    unseeded = [
        Path(a.path).name for a in analyses if a.log is not None and a.log.mllog_lines and not a.log.seeds
    ]
    if unseeded:
        listed = ", ".join(unseeded[:3]) + (f" and {len(unseeded) - 3} more" if len(unseeded) > 3 else "")
        message = f"{len(unseeded)} run(s) log no seed ({listed}); the official seed checker fails it"
        findings.append(
            warning(entry_path, RULE_SEED_MISSING, message, fix="log the seed with mllog (key 'seed')")
        )
    for analysis in analyses:
        if analysis.log is None:
            continue
        reported: set[str] = set()
        for seed, line in analysis.log.seeds:
            if seed in reported:
                continue  # one run may log its seed more than once
            reported.add(seed)
            if seed in first_seen:
                message = f"seed {seed} is also the seed of {Path(first_seen[seed]).name}"
                findings.append(
                    error(analysis.path, RULE_SEED, message, line, fix="give every run its own seed")
                )
            else:
                first_seen[seed] = analysis.path
    return findings


def check_run_scale(entry_path: Path, analyses: Sequence[LogAnalysis]) -> list[Finding]:
    """Every run of one entry logs the same number_of_nodes and accelerators_per_node."""
    scales: dict[str, list[str]] = {}
    for a in analyses:
        if a.log is None or (a.log.number_of_nodes is None and a.log.accelerators_per_node is None):
            continue
        label = f"{a.log.number_of_nodes} node(s) × {a.log.accelerators_per_node} accelerator(s)"
        scales.setdefault(label, []).append(Path(a.path).name)
    if len(scales) <= 1:
        return []
    listed = "; ".join(f"{label} in {', '.join(files[:3])}" for label, files in sorted(scales.items()))
    message = f"runs use different scales: {listed}"
    return [
        error(
            entry_path, RULE_RUN_SCALE, message, fix="run every result of one entry on the same system size"
        )
    ]


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
    message = f"models use different numbers of accelerators ({listed}); the official summarizer stops here"
    return [error(entry_path, RULE_INSTANCE_SCALE, message, fix="train every model on the same size")]


def check_strong_score(entry_path: Path, runs: Sequence[RunTiming]) -> list[Finding]:
    dropped = [Path(r.file).name for r in runs if not r.counts]
    if len(dropped) <= MAX_DROPPED_RUNS:
        return []
    message = (
        f"no score: {len(dropped)} runs dropped ({', '.join(dropped)}), olympic scoring "
        f"drops at most {MAX_DROPPED_RUNS}"
    )
    return [error(entry_path, RULE_SCORE, message, fix="fix or rerun the dropped runs")]


def check_weak_score(entry_path: Path, runs: Sequence[RunTiming], required: int | None) -> list[Finding]:
    counted = sum(r.counts for r in runs)
    if required is None or counted >= required:
        return []
    message = f"no score: {counted} compliant model(s), weak scaling needs at least {required}"
    return [error(entry_path, RULE_SCORE, message, fix="fix or rerun the dropped models")]


def check_pruned_logs(analyses: Sequence[LogAnalysis]) -> list[Finding]:
    """Pruned instances' logs must be valid and compliant too (HPC training rules); one finding a
    file, naming its first problem. They never count towards the score, so a warning."""
    findings: list[Finding] = []
    for analysis in analyses:
        if analysis.compliant:
            continue
        problems = check_log_file(analysis)
        first = problems[0] if problems else None
        where = None if first is None else first.line
        what = "fails the official compliance checker" if first is None else first.message
        message = f"pruned log is not valid and compliant: {what}"
        fix = first.fix if first is not None and first.fix else FIX_LOG
        findings.append(warning(analysis.path, RULE_PRUNED, message, where, fix=fix))
    return findings


def check_pruned_seeds(
    analyses: Sequence[LogAnalysis], pruned: Sequence[LogAnalysis], *, closed: bool
) -> list[Finding]:
    """Closed division: a kept instance whose seed is also a pruned instance's seed.

    "Runs with identical seeds must be pruned from final results" (HPC training rules): pruning
    one of two runs that share a seed leaves the other one in the score with that seed.
    """
    if not closed or not pruned:
        return []
    pruned_seeds: dict[str, str] = {}
    for a in pruned:
        for seed, _ in () if a.log is None else a.log.seeds:
            pruned_seeds.setdefault(seed, Path(a.path).name)
    findings: list[Finding] = []
    for a in analyses:
        for seed, line in () if a.log is None else a.log.seeds:
            if seed in pruned_seeds:
                message = (
                    f"seed {seed} is also the seed of pruned_results/{pruned_seeds[seed]}; the rules "
                    "prune runs with identical seeds, and this one is scored"
                )
                fix = "prune every run that shares a seed, or give every instance its own seed"
                findings.append(warning(a.path, RULE_SEED_PRUNED, message, line, fix=fix))
                break
    return findings
