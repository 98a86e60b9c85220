"""`check_command`: what `mlhpc check DIR` runs: check, print a table and findings, exit status."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlhpc.common.display.waiting import say_if_slow
from mlhpc.common.errors import MlhpcError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.safeio.writable import csv_kind, json_kind, page_kind, refuse_output_over_inputs

from .check import check_submission
from .export import COLUMNS, report_csv
from .findings import RULE_RUN_COUNT, RULE_SCORE, Finding
from .html_report import GENERATOR, REPORT_NAME, write_html_report
from .report import CheckReport, EntryReport
from .table import fitted_table, scores_text

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_CANNOT_RUN = 2

WIDTH_WHEN_PIPED = 160
CAMPAIGN_RULESET = "mlhpc run's campaign ruleset, from campaign.json"
"""The ruleset's origin when `mlhpc run` checks its own campaign (it passes no --ruleset)."""
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
    dropped = entry.dropped_runs
    pruned = len(entry.pruned_runs)
    return (
        f"{len(entry.runs)}"
        + (f" ({dropped} dropped)" if dropped else "")
        + (f" +{pruned} pruned" if pruned else "")
    )


def _rcp(entry: EntryReport) -> str:
    if entry.rcp is None:
        return "-"
    factor = f" ×{entry.rcp_scaling_factor:.4f}" if entry.rcp_scaling_factor != 1.0 else ""
    verdict = "smoke, no RCP" if entry.rcp.verdict == "smoke" else entry.rcp.verdict
    return verdict + factor


def report_table(report: CheckReport, console: Console | None = None) -> Table:
    """One row per entry: who, where, how many runs, the scores and how many findings, laid out
    to fit `console` with every number whole (table.fitted_table)."""
    title = shown(f"MLPerf HPC check of {report.root} (ruleset {report.ruleset}, {report.ruleset_reason})")

    def cells(e: EntryReport) -> dict[str, str | Text]:
        error = any(f.severity == "error" for f in e.findings)
        return {
            "submitter": e.submitter,
            "system": e.system,
            "scaling": e.scaling,
            "benchmark": e.benchmark,
            "runs": _runs(e),
            "raw min": _minutes(e.score_raw_min),
            "RCP": _rcp(e),
            "score min": _minutes(e.score_min),
            "models/min": "-" if e.models_per_min is None else f"{e.models_per_min:.4f}",
            "findings": Text(_count(e.findings), style="red" if error else ""),
        }

    return fitted_table(report, console or Console(width=10_000), cells, title)


def flops_lines(report: CheckReport) -> list[Text]:
    """HPC AI500's figures for the entries whose runs log them: achieved FLOP/s and Valid FLOPS."""
    lines = []
    for e in report.entries:
        flops = e.mean_flops()
        if flops is not None:
            achieved, valid, runs = flops
            lines.append(
                Text(
                    shown(
                        f"{e.submitter}/{e.system}/{e.scaling}/{e.benchmark}: achieved {achieved:.4g} FLOP/s, "
                        f"Valid FLOPS {valid:.4g} (HPC AI500; mean of {runs} compliant run(s))"
                    )
                )
            )
    return lines


def energy_lines(report: CheckReport) -> list[Text]:
    """Energy to train of the entries with power logs, as the official summarizer scores it."""
    lines = []
    for e in report.entries:
        if e.energy_j is None:
            continue
        what = "energy to train" if e.scaling == "strong" else "energy per model (summarizer's weak column)"
        text = f"{e.submitter}/{e.system}/{e.scaling}/{e.benchmark}: {what} {e.energy_j / 3.6e6:.6g} kWh"
        if e.models_per_kwh is not None:
            text += f"; {e.models_per_kwh:.6g} models per kWh"
        lines.append(Text(shown(text)))
    return lines


def finding_line(finding: Finding) -> Text:
    """`severity path:line rule: message`, the severity coloured; every character from outside
    (a folder's name, a log's text) shown as data, so the line is one line."""
    text = Text(finding.severity, style=_STYLE.get(finding.severity, ""))
    text.append(shown(finding.format()[len(finding.severity) :]))
    return text


def print_report(report: CheckReport, console: Console) -> None:
    console.print(report_table(report, console))
    findings = list(report.all_findings())
    for line in [*flops_lines(report), *energy_lines(report)]:
        console.print(line, soft_wrap=True)
    for finding in findings:
        console.print(finding_line(finding), soft_wrap=True)
    errors = sum(f.severity == "error" for f in findings)
    verdict = "FAILED" if errors else "PASSED"
    console.print(
        Text(
            f"{verdict}: {len(report.entries)} entries, {errors} error(s), "
            f"{len(findings) - errors} warning(s){scores_text(report)}",
            style="bold red" if errors else "bold green",
        ),
        soft_wrap=True,
    )


JSON_FORMAT = "mlhpc check"
"""The first key of the JSON report: `--json` replaces an existing file only when it carries it."""
JSON_KIND = json_kind(JSON_FORMAT)
CSV_KIND = csv_kind(",".join(COLUMNS), "a `mlhpc check --csv` table")
PAGE_FILES = {REPORT_NAME: page_kind(GENERATOR)}


def judge_outputs(path: Path, outputs: dict[str, Path | None]) -> dict[str, Path | None]:
    """Each output's real path, or a ConfigError before the check: none may be, or lie in, the
    checked folder, and an existing one must be this option's own earlier output."""
    judged: dict[str, Path | None] = {}
    for kind, where in outputs.items():
        option = f"--{kind}"
        if where is None:
            judged[kind] = None
        elif kind == "report":
            judged[kind] = refuse_output_over_inputs(where, [path], option, folder=True, writes=PAGE_FILES)
        else:
            judged[kind] = refuse_output_over_inputs(
                where, [path], option, kind=JSON_KIND if kind == "json" else CSV_KIND
            )
    return judged


def _inside(path: Path, root: Path) -> bool:
    resolved = path.resolve()
    return resolved == root or root in resolved.parents


def write_outputs(report: CheckReport, outputs: dict[str, Path | None], out: Console) -> None:
    """Write the JSON, CSV and HTML the user asked for; OSError and MlhpcError propagate."""
    root = Path(report.root)
    for kind, path in outputs.items():
        if path is not None and _inside(path, root):
            raise MlhpcError(
                f"--{kind} {shown(path)} is inside the checked folder; pass a path outside it "
                "(the check never writes into a submission)"
            )
    if outputs.get("json") is not None:
        data = {"format": JSON_FORMAT, **report.to_json()}
        out.print(Text(f"wrote {shown(atomic_write_json(outputs['json'], data))}"))
    if outputs.get("csv") is not None:
        out.print(Text(f"wrote {shown(atomic_write_text(outputs['csv'], report_csv(report)))}"))
    if outputs.get("report") is not None:
        out.print(Text(f"wrote {shown(write_html_report(report, outputs['report']))}"))


def error_line(message: str) -> str:
    """`mlhpc: error: ...` as every other command says it: one line, names shown as data."""
    return f"mlhpc: error: {shown(message.strip())}"


def check_command(
    path: Path,
    *,
    ruleset: str | None = None,
    json_path: Path | None = None,
    csv_path: Path | None = None,
    report_dir: Path | None = None,
    jobs: int | None = None,
    console: Console | None = None,
    ruleset_reason: str = "--ruleset",
    short_campaign: Callable[[int, int], str] | None = None,
) -> int:
    """Check `path`, print the table and every finding, write the outputs the user names.

    `ruleset` None detects it from the logs; a given one is labelled with `ruleset_reason`, where
    it came from (`mlhpc run` passes CAMPAIGN_RULESET). Returns 0 when there is no error finding
    (warnings allowed), 1 when there is one, 2 when the check could not run (no such folder,
    no results, unknown ruleset, an output not writable or inside the submission). Nothing is
    written into the submission. With `short_campaign` (mlhpc run's own check), an entry whose
    only errors say it has fewer runs than a score needs is a success of its kind: the line
    `short_campaign(found, required)` is printed and the status is 0.
    """
    out = console or Console(highlight=False)
    if console is None and not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = WIDTH_WHEN_PIPED  # a log file has room; rich would squeeze into 80
    err = Console(stderr=True, highlight=False)
    try:
        outputs = judge_outputs(path, {"json": json_path, "csv": csv_path, "report": report_dir})
        with say_if_slow(f"checking {shown(path)}"):  # a whole round takes tens of seconds
            report = check_submission(path, ruleset=ruleset, jobs=jobs, ruleset_reason=ruleset_reason)
        print_report(report, out)
        write_outputs(report, outputs, out)
    except MlhpcError as e:
        err.print(Text(error_line(str(e))), soft_wrap=True)
        return EXIT_CANNOT_RUN
    except OSError as e:
        why = f"cannot write {e.filename}: {e.strerror or e}; pass a writable path"
        err.print(Text(error_line(why)), soft_wrap=True)
        return EXIT_CANNOT_RUN
    if report.has_errors and short_campaign is not None:
        short = runs_short(report)
        if short is not None:
            out.print(Text(shown(short_campaign(*short)), style="bold"), soft_wrap=True)
            return EXIT_OK
    return EXIT_ERRORS if report.has_errors else EXIT_OK


def runs_short(report: CheckReport) -> tuple[int, int] | None:
    """(found, required) when the report's only errors are one entry's too few runs (and, weak,
    the score those few cannot make); None when anything else failed, or too many runs."""
    from mlhpc.common.contract.catalog import required_run_count

    if any(f.severity == "error" for f in report.findings) or len(report.entries) != 1:
        return None
    (entry,) = report.entries
    errors = {f.rule for f in entry.findings if f.severity == "error"}
    required = required_run_count(entry.benchmark)
    found = len(entry.runs)
    allowed = {RULE_RUN_COUNT, RULE_SCORE} if entry.scaling == "weak" else {RULE_RUN_COUNT}
    if required is None or RULE_RUN_COUNT not in errors or not errors <= allowed or found >= required:
        return None
    return found, required
