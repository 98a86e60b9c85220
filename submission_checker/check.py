"""`check_submission`: run every check on a submission folder and score its entries (read-only)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import required_run_count

from .compliance import DEFAULT_RULESET, LogAnalysis, analyse_logs, validate_ruleset
from .findings import Finding
from .layout_checks import (
    EntryDir,
    check_benchmark_name,
    check_implementation,
    check_run_count,
    check_stray_files,
    check_system_json,
    find_entries,
    find_org_dirs,
)
from .report import CheckReport, EntryReport, RunReport
from .run_checks import (
    check_instance_scale,
    check_log_file,
    check_seeds,
    check_strong_score,
    check_weak_score,
    run_timing,
)
from .scoring import apply_scaling_factor, strong_score, weak_score


def _relative(path: str | Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _org_findings(org_dir: Path, entries: list[EntryDir]) -> list[Finding]:
    """System descriptions and implementation folders: findings that belong to no one entry."""
    findings: list[Finding] = []
    for system in sorted({e.system for e in entries}):
        findings += check_system_json(org_dir, system)
    for benchmark in sorted({e.benchmark for e in entries}):
        findings += check_implementation(org_dir, benchmark)
    return findings


def score_entry(
    entry: EntryDir, analyses: Mapping[str, LogAnalysis], ruleset: str, root: Path
) -> EntryReport:
    """Checks and score of one entry, from its files' analyses."""
    files = [analyses[str(p)] for p in entry.result_files]
    findings: list[Finding] = [
        *check_benchmark_name(entry, ruleset),
        *check_run_count(entry),
        *check_stray_files(entry),
    ]
    for analysis in files:
        findings += check_log_file(analysis)
    findings += check_seeds(files)
    timings = [run_timing(a) for a in files]
    models_per_min: float | None = None
    if entry.scaling == "strong":
        findings += check_strong_score(entry.path, timings)
        raw = strong_score(timings)
    else:
        required = required_run_count(entry.benchmark)
        findings += check_instance_scale(entry.path, files)
        findings += check_weak_score(entry.path, timings, required)
        weak = weak_score(timings, required) if required is not None else None
        raw = None if weak is None else weak.total_min
        models_per_min = None if weak is None else weak.models_per_min
    factor = 1.0  # the RCP scaling factor goes here once the RCP check is wired in
    runs = tuple(RunReport(_relative(t.file, root), t.minutes, t.compliant) for t in timings)
    return EntryReport(
        submitter=entry.submitter,
        system=entry.system,
        benchmark=entry.benchmark,
        scaling=entry.scaling,
        runs=runs,
        score_raw_min=raw,
        score_min=apply_scaling_factor(raw, factor),
        models_per_min=models_per_min,
        findings=tuple(f.relative_to(root) for f in findings),
        rcp_scaling_factor=factor,
    )


def check_submission(
    path: Path | str, *, ruleset: str = DEFAULT_RULESET, jobs: int | None = None
) -> CheckReport:
    """Check and score one organisation's folder or a folder of organisations; never writes.

    Raises SubmissionError when `path` is not a folder, holds no results, or `ruleset` is
    unknown. Everything wrong inside the submission is a Finding in the report.
    """
    validate_ruleset(ruleset)
    root = Path(path).resolve()
    entries: list[EntryDir] = []
    findings: list[Finding] = []
    try:
        for org_dir in find_org_dirs(root):
            org_entries, layout_findings = find_entries(org_dir)
            entries += org_entries
            findings += layout_findings + _org_findings(org_dir, org_entries)
    except OSError as e:
        raise SubmissionError(f"cannot read {e.filename or root}: {e.strerror or e}") from e
    if not entries:
        raise SubmissionError(f"{root} holds no results/<system>/<strong|weak>/<benchmark>/ folder to check")
    analyses = analyse_logs([p for e in entries for p in e.result_files], ruleset, jobs)
    reports = tuple(score_entry(e, analyses, ruleset, root) for e in entries)
    return CheckReport(
        root=str(root),
        ruleset=ruleset,
        entries=reports,
        findings=tuple(f.relative_to(root) for f in findings),
    )
