"""`check_submission`: run every check on a submission folder and score its entries (read-only)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.contract.catalog import required_run_count
from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import results_root

from .claims import check_logs_against_system, check_scale_claim
from .compliance import DEFAULT_RULESET, LogAnalysis, analyse_logs, known_rulesets, refusal, validate_ruleset
from .energy import POWER_DIR, entry_energy, system_nodes
from .findings import RULE_SYMLINK, Finding
from .layout_checks import (
    EntryDir,
    SystemDesc,
    check_benchmark_name,
    check_implementation,
    check_run_count,
    check_stray_files,
    find_entries,
    find_submitter_dirs,
    link_out,
    load_system,
)
from .logparse import EVAL_KEYS, RunLog, sniff_log
from .rcp_checks import entry_rcp
from .report import CheckReport, EntryReport, RunReport
from .ruleset import RulesetChoice, detect_ruleset, ruleset_of_folder
from .run_checks import (
    check_instance_scale,
    check_log_file,
    check_pruned_logs,
    check_pruned_seeds,
    check_run_scale,
    check_seeds,
    check_strong_score,
    check_weak_score,
    run_timing,
)
from .scoring import apply_scaling_factor, log_fixed_epoch_score, olympic_drops, strong_score, weak_score

SystemKey = tuple[Path, str]


def _relative(path: str | Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _division(system: SystemDesc, files: Sequence[LogAnalysis]) -> str | None:
    """The system description's division; the logs' when the description cannot be read."""
    if system.division is not None:
        return system.division
    return next((a.log.division for a in files if a.log is not None and a.log.division), None)


def _metric(files: Sequence[LogAnalysis]) -> str | None:
    keys = [key for a in files if a.log is not None for key, _, _ in a.log.evals]
    return max(EVAL_KEYS, key=keys.count) if keys else None


def _flops_facts(log: RunLog | None, minutes: float | None) -> dict[str, Any]:
    """FLOPS and Valid FLOPS of one run. A fixed-epoch run is scored as HPC AI500 scores it
    (`scoring.fixed_epoch_score`: FLOPS over run_start..run_stop, Valid FLOPS with the quality
    penalty, worked out from its log); a target-mode run keeps the values it logged."""
    if log is None:
        return {}
    if log.loop_mode == "fixed_epochs":
        score = log_fixed_epoch_score(log, minutes)
        return {
            "achieved_flops_per_s": None if score is None else score.flops,
            "valid_flops": None if score is None else score.valid_flops,
            "loop_mode": log.loop_mode,
        }
    return {"achieved_flops_per_s": log.achieved_flops_per_s, "valid_flops": log.valid_flops}


def _run_facts(log: RunLog | None) -> dict[str, Any]:
    """Staging time, median throughput and scale of one run, for the results store."""
    if log is None:
        return {}
    nodes = log.number_of_nodes
    return {
        "staging_s": None if log.staging_ms is None else log.staging_ms / 1000,
        "samples_per_s": statistics.median(log.throughputs) if log.throughputs else None,
        "nodes": nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None,
        "accelerators": log.instance_scale,
    }


def _pruned_reports(files: Sequence[LogAnalysis], root: Path) -> tuple[RunReport, ...]:
    reports = []
    for analysis in files:
        timing = run_timing(analysis)
        reports.append(
            RunReport(_relative(analysis.path, root), timing.minutes, analysis.compliant, "pruned")
        )
    return tuple(reports)


def _run_reports(
    files: Sequence[LogAnalysis], entry: EntryDir, root: Path, metric: str | None
) -> tuple[RunReport, ...]:
    timings = [run_timing(a) for a in files]
    roles = (
        olympic_drops(timings)
        if entry.scaling == "strong"
        else [None if t.counts else "not counted" for t in timings]
    )
    runs = []
    for analysis, timing, role in zip(files, timings, roles, strict=True):
        log = analysis.log
        converged = log is not None and log.rcp.converged and log.rcp.error is None
        evals = () if log is None else tuple((e, v) for k, e, v in log.evals if k == metric)
        epochs = log.rcp.epochs if converged and log is not None else None
        runs.append(
            RunReport(
                _relative(analysis.path, root),
                timing.minutes,
                analysis.compliant,
                role,
                epochs,
                evals,
                **_flops_facts(log, timing.minutes),
                **_run_facts(log),
            )
        )
    return tuple(runs)


@dataclass(frozen=True)
class _Score:
    raw_min: float | None
    models_per_min: float | None = None
    num_models: int | None = None
    instance_scale: int | None = None


def _score(entry: EntryDir, files: Sequence[LogAnalysis]) -> tuple[_Score, list[Finding]]:
    """Strong: the olympic mean. Weak: models, their scale, the total time, models per minute."""
    timings = [run_timing(a) for a in files]
    if entry.scaling == "strong":
        return _Score(strong_score(timings)), check_strong_score(entry.path, timings)
    required = required_run_count(entry.benchmark)
    findings = check_instance_scale(entry.path, files) + check_weak_score(entry.path, timings, required)
    weak = weak_score(timings, required) if required is not None else None
    if weak is None:
        return _Score(None), findings
    scales = {a.log.instance_scale for a in files if a.compliant and a.log is not None}
    scale = next(iter(scales)) if len(scales) == 1 else None
    return _Score(weak.total_min, weak.models_per_min, weak.num_models, scale), findings


def score_entry(
    entry: EntryDir, analyses: Mapping[str, LogAnalysis], ruleset: str, root: Path, system: SystemDesc
) -> EntryReport:
    """Checks and score of one entry, from its files' analyses."""
    files = [analyses[str(p)] for p in entry.result_files]
    pruned = [analyses[str(p)] for p in entry.pruned_files]
    division = _division(system, files)
    findings = _entry_checks(entry, files, pruned, ruleset, system, closed=division == "closed")
    score, score_findings = _score(entry, files)
    known = entry.benchmark in required_benchmarks()
    rcp, factor, rcp_findings = entry_rcp(entry, files, ruleset, closed=division == "closed" and known)
    metric = _metric(files)
    energy, energy_findings = (
        (None, [])
        if link_out(entry.path / POWER_DIR, root) is not None
        else entry_energy(
            entry.path,
            [run_timing(a) for a in files],
            entry.scaling,
            factor,
            system_nodes(system.fields),
        )
    )
    return EntryReport(
        submitter=entry.submitter,
        system=entry.system,
        benchmark=entry.benchmark,
        scaling=entry.scaling,
        runs=_run_reports(files, entry, root, metric),
        score_raw_min=score.raw_min,
        score_min=apply_scaling_factor(score.raw_min, factor),
        models_per_min=score.models_per_min,
        findings=tuple(
            f.relative_to(root) for f in [*findings, *score_findings, *rcp_findings, *energy_findings]
        ),
        rcp_scaling_factor=factor,
        division=division,
        rcp=rcp,
        num_models=score.num_models,
        instance_scale=score.instance_scale,
        metric=metric,
        pruned_runs=_pruned_reports(pruned, root),
        energy_j=None if energy is None else energy.energy_j,
        energy_total_j=None if energy is None else energy.total_j,
        models_per_kwh=None if energy is None else energy.models_per_kwh,
    )


def _entry_checks(
    entry: EntryDir,
    files: list[LogAnalysis],
    pruned: list[LogAnalysis],
    ruleset: str,
    system: SystemDesc,
    *,
    closed: bool,
) -> list[Finding]:
    """Whether the entry is well formed, apart from its score: its layout and run count, each
    log, the seeds, the runs' scale, and the logs against the system they claim."""
    findings: list[Finding] = [
        *check_benchmark_name(entry, ruleset),
        *check_run_count(entry),
        *check_stray_files(entry),
    ]
    for analysis in files:
        findings += check_log_file(analysis)
    findings += check_pruned_logs(pruned)
    findings += check_seeds(entry.path, files, closed=closed)
    findings += check_pruned_seeds(files, pruned, closed=closed)
    findings += check_run_scale(entry.path, files)
    findings += check_logs_against_system(entry, [*files, *pruned], system)
    findings += check_scale_claim(entry, [*files, *pruned], system)
    return findings


def required_benchmarks() -> set[str]:
    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    return set(_ALL_RESULT_FILE_COUNTS["hpc"])


def _gather(root: Path) -> tuple[list[EntryDir], dict[SystemKey, SystemDesc], list[Finding]]:
    """Every entry, the system descriptions they name, and the findings about folders."""
    entries: list[EntryDir] = []
    systems: dict[SystemKey, SystemDesc] = {}
    submitter_dirs, findings = find_submitter_dirs(root)
    for submitter_dir in submitter_dirs:
        submitter_entries, layout_findings = find_entries(submitter_dir, root)
        entries += submitter_entries
        findings += layout_findings
        for name in sorted({e.system for e in submitter_entries}):
            systems[(submitter_dir, name)] = load_system(submitter_dir, name, root)
            findings += systems[(submitter_dir, name)].findings
        for benchmark in sorted({e.benchmark for e in submitter_entries}):
            findings += check_implementation(submitter_dir, benchmark)
    return entries, systems, findings


def _choose_ruleset(ruleset: str | None, files: Sequence[Path], root: Path, reason: str) -> RulesetChoice:
    if ruleset is not None:
        return RulesetChoice(validate_ruleset(ruleset), reason)
    sniffs = [sniff_log(p) for p in files if refusal(str(p)) is None]
    # The round folder's name: the root itself, or the folder holding the organisation checked.
    names = [root.name, root.parent.name] if results_root(root).is_dir() else [root.name]
    folder = next((n for n in names if ruleset_of_folder(n, known_rulesets()) is not None), root.name)
    return detect_ruleset(sniffs, known_rulesets(), DEFAULT_RULESET, folder)


def _refused_link(path: Path, why: str) -> LogAnalysis:
    return LogAnalysis(
        str(path), False, (), None, (RULE_SYMLINK, f"{why}; not read", "copy the file into the submission")
    )


def check_submission(
    path: Path | str,
    *,
    ruleset: str | None = None,
    jobs: int | None = None,
    ruleset_reason: str = "--ruleset",
) -> CheckReport:
    """Check and score one organisation's folder or a folder of organisations; never writes.

    `ruleset` None detects it from the logs; a given one is reported as coming from
    `ruleset_reason` (the option that named it, or "mlhpc run's campaign ruleset"). Raises SubmissionError when `path` is not a folder,
    holds no results, or `ruleset` is unknown; everything wrong inside the submission is a
    Finding in the report.
    """
    root = Path(path).resolve()
    try:
        entries, systems, findings = _gather(root)
    except OSError as e:
        raise SubmissionError(f"cannot read {e.filename or root}: {e.strerror or e}") from e
    if not entries:
        raise SubmissionError(f"{root} holds no results/<system>/<strong|weak>/<benchmark>/ folder to check")
    files = [p for e in entries for p in (*e.result_files, *e.pruned_files)]
    links = {str(p): why for p in files if (why := link_out(p, root)) is not None}
    readable = [p for p in files if str(p) not in links]
    choice = _choose_ruleset(ruleset, readable, root, ruleset_reason)
    analyses = analyse_logs(readable, choice.ruleset, jobs)
    analyses.update({name: _refused_link(Path(name), why) for name, why in links.items()})
    reports = tuple(
        score_entry(e, analyses, choice.ruleset, root, systems[(e.submitter_dir, e.system)]) for e in entries
    )
    return CheckReport(
        root=str(root),
        ruleset=choice.ruleset,
        entries=reports,
        findings=tuple(f.relative_to(root) for f in findings),
        ruleset_reason=choice.reason,
    )
