"""`check_command`: what `mlhpc check DIR` runs: check, print a table and findings, exit status."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlhpc.common.errors import MlhpcError
from mlhpc.common.fileio import atomic_write_json

from .check import check_submission
from .compliance import DEFAULT_RULESET
from .findings import Finding
from .report import CheckReport, EntryReport

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_CANNOT_RUN = 2

WIDTH_WHEN_PIPED = 160
_STYLE = {"error": "bold red", "warning": "yellow"}


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def _count(findings: tuple[Finding, ...]) -> str:
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    parts = [f"{errors} error(s)"] if errors else []
    parts += [f"{warnings} warning(s)"] if warnings else []
    return ", ".join(parts) or "0"


def _runs(entry: EntryReport) -> str:
    dropped = sum(not r.compliant or r.minutes is None for r in entry.runs)
    return f"{len(entry.runs)}" + (f" ({dropped} dropped)" if dropped else "")


def report_table(report: CheckReport) -> Table:
    """One row per entry: who, where, how many runs, the scores and how many findings."""
    table = Table(title=Text(f"MLPerf HPC check of {report.root} (ruleset {report.ruleset})"))
    for name in ("submitter", "system", "scaling", "benchmark", "runs"):
        table.add_column(name)
    for name in ("raw min", "score min", "models/min"):
        table.add_column(name, justify="right")
    table.add_column("findings")
    for e in report.entries:
        per_min = "-" if e.models_per_min is None else f"{e.models_per_min:.4f}"
        table.add_row(
            *(Text(v) for v in (e.submitter, e.system, e.scaling, e.benchmark, _runs(e))),
            _minutes(e.score_raw_min),
            _minutes(e.score_min),
            per_min,
            Text(
                _count(e.findings),
                style="red" if any(f.severity == "error" for f in e.findings) else "",
            ),
        )
    return table


def finding_line(finding: Finding) -> Text:
    """`severity path:line rule: message`, the severity coloured."""
    text = Text(finding.severity, style=_STYLE.get(finding.severity, ""))
    text.append(finding.format()[len(finding.severity) :])
    return text


def print_report(report: CheckReport, console: Console) -> None:
    console.print(report_table(report))
    findings = list(report.all_findings())
    for finding in findings:
        console.print(finding_line(finding), soft_wrap=True)
    errors = sum(f.severity == "error" for f in findings)
    verdict = "FAILED" if errors else "PASSED"
    console.print(
        Text(
            f"{verdict}: {len(report.entries)} entries, {errors} error(s), "
            f"{len(findings) - errors} warning(s)",
            style="bold red" if errors else "bold green",
        )
    )


def check_command(
    path: Path,
    *,
    ruleset: str = DEFAULT_RULESET,
    json_path: Path | None = None,
    jobs: int | None = None,
    console: Console | None = None,
) -> int:
    """Check `path`, print the table and every finding, write JSON to `json_path` if given.

    Returns 0 when there is no error finding (warnings allowed), 1 when there is one, 2 when the
    check could not run (no such folder, no results, unknown ruleset, JSON not writable).
    Nothing is written into the submission except `json_path` itself, when the user names it.
    """
    out = console or Console(highlight=False)
    if console is None and not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = WIDTH_WHEN_PIPED  # a log file has room; rich would squeeze into 80
    err = Console(stderr=True, highlight=False)
    try:
        report = check_submission(path, ruleset=ruleset, jobs=jobs)
    except MlhpcError as e:
        err.print(Text(f"error: {e}"), soft_wrap=True)
        return EXIT_CANNOT_RUN
    print_report(report, out)
    if json_path is not None:
        try:
            atomic_write_json(json_path, report.to_json())
        except OSError as e:
            err.print(Text(f"error: cannot write {json_path}: {e.strerror or e}"), soft_wrap=True)
            return EXIT_CANNOT_RUN
        out.print(Text(f"wrote {json_path}"))
    return EXIT_ERRORS if report.has_errors else EXIT_OK
