"""What a checked entry puts in the results store: its row (from `CheckReport`, nothing re-read)
and its runs' rows, with the figures over the runs the score counts."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from mlhpc.submission_checker.report import CheckReport, EntryReport, RunReport


def _kept(entry: EntryReport) -> list[RunReport]:
    """The runs the score counts (strong: olympic, without fastest and slowest; weak: counted)."""
    return [r for r in entry.runs if r.dropped is None]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mode(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(set(known), key=known.count) if known else None


def entry_figures(entry: EntryReport) -> dict[str, Any]:
    """Scale, epochs, staging and per-accelerator throughput of an entry, over its counted runs.

    staging_share: staging seconds over the time to train, summed over the runs that logged both.
    Per-accelerator throughput: median over runs of (median tracked_stats samples/s) / accelerators.
    """
    runs = _kept(entry)
    both = [r for r in runs if r.staging_s is not None and r.minutes]
    per_acc = [r.samples_per_s / r.accelerators for r in runs if r.samples_per_s and r.accelerators]
    return {
        "nodes": _mode([r.nodes for r in runs]),
        "accelerators": _mode([r.accelerators for r in runs]),
        "epochs": _mean([r.epochs for r in runs]),
        "staging_s": _mean([r.staging_s for r in runs]),
        "staging_share": (
            sum(r.staging_s or 0.0 for r in both) / sum((r.minutes or 0.0) * 60 for r in both)
            if both
            else None
        ),
        "samples_per_s_per_accelerator": statistics.median(per_acc) if per_acc else None,
    }


def entry_row(report: CheckReport, entry: EntryReport, origin: str, added_at: str) -> dict[str, Any]:
    """An entry's row of the store: who, what, its score and findings, and its figures."""
    errors = sum(f.severity == "error" for f in entry.findings)
    return {
        "origin": origin,
        "ruleset": report.ruleset,
        "submitter": entry.submitter,
        "system": entry.system,
        "scaling": entry.scaling,
        "benchmark": entry.benchmark,
        "division": entry.division,
        "source": report.root,
        "num_models": entry.num_models,
        "runs": len(entry.runs),
        "pruned_runs": len(entry.pruned_runs),
        "score_raw_min": entry.score_raw_min,
        "score_min": entry.score_min,
        "rcp_scaling_factor": entry.rcp_scaling_factor,
        "models_per_min": entry.models_per_min,
        "rcp_verdict": None if entry.rcp is None else entry.rcp.verdict,
        "energy_j": entry.energy_j,
        "energy_total_j": entry.energy_total_j,
        "models_per_kwh": entry.models_per_kwh,
        "errors": errors,
        "warnings": len(entry.findings) - errors,
        "added_at": added_at,
        **entry_figures(entry),
    }


def run_rows(entry_id: int, entry: EntryReport) -> list[tuple[Any, ...]]:
    """The rows of an entry's runs, scored and pruned, in the runs table's column order."""
    rows = []
    for pruned, runs in ((0, entry.runs), (1, entry.pruned_runs)):
        for r in runs:
            values = (r.file, pruned, r.minutes, int(r.compliant), r.dropped, r.epochs, r.staging_s)
            rows.append((entry_id, *values, r.samples_per_s, r.nodes, r.accelerators))
    return rows
