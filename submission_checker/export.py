"""The report as CSV: one row per entry, for spreadsheets and scripts."""

from __future__ import annotations

import csv
import io

from .report import CheckReport, EntryReport

COLUMNS = (
    "submitter",
    "system",
    "scaling",
    "benchmark",
    "division",
    "ruleset",
    "runs",
    "dropped_runs",
    "pruned_runs",
    "score_raw_min",
    "rcp_scaling_factor",
    "score_min",
    "num_models",
    "instance_scale",
    "models_per_min",
    "energy_j",
    "energy_total_j",
    "models_per_kwh",
    "rcp_verdict",
    "rcp_message",
    "errors",
    "warnings",
)


def _row(report: CheckReport, e: EntryReport) -> dict[str, object]:
    errors = sum(f.severity == "error" for f in e.findings)
    return {
        "submitter": e.submitter,
        "system": e.system,
        "scaling": e.scaling,
        "benchmark": e.benchmark,
        "division": e.division or "",
        "ruleset": report.ruleset,
        "runs": len(e.runs),
        "dropped_runs": e.dropped_runs,
        "pruned_runs": len(e.pruned_runs),
        "score_raw_min": "" if e.score_raw_min is None else repr(e.score_raw_min),
        "rcp_scaling_factor": repr(e.rcp_scaling_factor),
        "score_min": "" if e.score_min is None else repr(e.score_min),
        "num_models": "" if e.num_models is None else e.num_models,
        "instance_scale": "" if e.instance_scale is None else e.instance_scale,
        "models_per_min": "" if e.models_per_min is None else repr(e.models_per_min),
        "energy_j": "" if e.energy_j is None else repr(e.energy_j),
        "energy_total_j": "" if e.energy_total_j is None else repr(e.energy_total_j),
        "models_per_kwh": "" if e.models_per_kwh is None else repr(e.models_per_kwh),
        "rcp_verdict": "" if e.rcp is None else e.rcp.verdict,
        "rcp_message": "" if e.rcp is None else e.rcp.message,
        "errors": errors,
        "warnings": len(e.findings) - errors,
    }


def report_csv(report: CheckReport) -> str:
    """The CSV text (full float precision, so scores compare exactly)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for entry in report.entries:
        writer.writerow(_row(report, entry))
    return out.getvalue()
