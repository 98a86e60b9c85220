"""`--report DIR`: one self-contained HTML page (inline SVG plots, no scripts, no downloads).

Per entry: its scores, the run times with the dropped runs marked, each run's convergence curve
with the target from the ruleset's rules, the RCP comparison, and every finding with its line.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Sequence
from pathlib import Path

from mlhpc.common.display.html_words import STYLE as WORDS_STYLE
from mlhpc.common.display.html_words import keep_words
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.writable import generator_meta

from .energy import J_PER_KWH
from .findings import Finding
from .report import CheckReport, EntryReport

REPORT_NAME = "index.html"
GENERATOR = "mlhpc check"
"""The page's generator tag: `--report` replaces an index.html only when it carries it."""
MAX_CURVES = 100  # a weak entry can have 600 models; the first hundred show the spread
WIDTH, HEIGHT, PAD = 560, 260, 44
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_TARGET = re.compile(r"v\['value'\]\s*(<=|>=|<|>)\s*([0-9.eE+-]+)")
# Fits a 1200 px window and never breaks a word or a number: a cell wraps between words only
# (numbers and headers not at all), a table wider than the page scrolls inside its own box
# (.wide), plots shrink to the page's width; only prose outside tables may break a long path.
STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222;overflow-wrap:anywhere}
.wide{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}
td,th,td code{overflow-wrap:normal;word-break:keep-all}th{white-space:nowrap}code{overflow-wrap:anywhere}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.dropped td{color:#999;text-decoration:line-through}
.error{color:#b00;font-weight:bold}.warning{color:#a60}.ok{color:#080}section{margin-top:2.5em}
svg{background:#fafafa;border:1px solid #ddd;max-width:100%;height:auto}code{font-size:.9em}
"""


@functools.cache
def convergence_target(ruleset: str, benchmark: str) -> tuple[str, str, float] | None:
    """(eval key, comparison, value) from the closed rules' ATLEAST_ONE_CHECK, or None."""
    import mlperf_logging.compliance_checker as cc
    import yaml

    path = Path(cc.__file__).parent / f"hpc_{ruleset}" / f"closed_{benchmark}.yaml"
    try:
        rules = yaml.load(path.read_text(), Loader=yaml.BaseLoader) or []
    except (OSError, yaml.YAMLError):
        return None
    for rule in rules:
        key = rule.get("KEY", {}) if isinstance(rule, dict) else {}
        found = _TARGET.search(str(key.get("ATLEAST_ONE_CHECK", "")))
        if found:
            return str(key["NAME"]), found.group(1), float(found.group(2))
    return None


def _e(value: object) -> str:
    """Text from outside as data: control and bidi characters escaped, then HTML-escaped."""
    return html.escape(shown(value))


def _tick(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _num(value: float | None, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _scale(lo: float, hi: float, size: float, flip: bool = False):
    span = (hi - lo) or 1.0

    def at(v: float) -> float:
        frac = (v - lo) / span
        return PAD + (1 - frac if flip else frac) * (size - 2 * PAD)

    return at


def _axes(xlo: float, xhi: float, ylo: float, yhi: float, xlabel: str, ylabel: str) -> list[str]:
    x, y = _scale(xlo, xhi, WIDTH), _scale(ylo, yhi, HEIGHT, flip=True)
    parts = [
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">{_e(xlabel)}</text>',
        f'<text x="12" y="{HEIGHT / 2}" font-size="12" transform="rotate(-90 12 {HEIGHT / 2})" '
        f'text-anchor="middle">{_e(ylabel)}</text>',
    ]
    for i in range(5):
        xv, yv = xlo + (xhi - xlo) * i / 4, ylo + (yhi - ylo) * i / 4
        parts.append(
            f'<text x="{x(xv):.1f}" y="{HEIGHT - PAD + 14}" font-size="10" text-anchor="middle">{_tick(xv)}</text>'
        )
        parts.append(
            f'<text x="{PAD - 4}" y="{y(yv) + 3:.1f}" font-size="10" text-anchor="end">{_tick(yv)}</text>'
        )
    return parts


def convergence_svg(entry: EntryReport, target: tuple[str, str, float] | None) -> str:
    """Eval metric against epoch, one line per run (dropped runs grey), the target dashed."""
    curves = [(r, r.evals) for r in entry.runs[:MAX_CURVES] if r.evals]
    if not curves:
        return "<p>No eval lines with epoch_num to plot.</p>"
    points = [p for _, evals in curves for p in evals]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if target is not None:
        ys.append(target[2])
    xlo, xhi, ylo, yhi = min(xs), max(xs), min(ys), max(ys)
    x, y = _scale(xlo, xhi, WIDTH), _scale(ylo, yhi, HEIGHT, flip=True)
    parts = _axes(xlo, xhi, ylo, yhi, "epoch_num", entry.metric or "eval metric")
    for i, (run, evals) in enumerate(curves):
        colour = "#bbb" if run.dropped == "not counted" else COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(e):.1f},{y(v):.1f}" for e, v in evals)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.3" points="{path}">'
            f"<title>{_e(Path(run.file).name)}</title></polyline>"
        )
    if target is not None:
        ty = y(target[2])
        parts.append(
            f'<line x1="{PAD}" y1="{ty:.1f}" x2="{WIDTH - PAD}" y2="{ty:.1f}" stroke="#b00" stroke-dasharray="6 4"/>'
        )
        parts.append(
            f'<text x="{WIDTH - PAD}" y="{ty - 4:.1f}" font-size="11" fill="#b00" text-anchor="end">'
            f"target {_e(target[0])} {_e(target[1])} {target[2]:g}</text>"
        )
    note = (
        f"<p>First {MAX_CURVES} of {len(entry.runs)} runs plotted.</p>"
        if len(entry.runs) > MAX_CURVES
        else ""
    )
    return f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">{"".join(parts)}</svg>{note}'


def rcp_svg(entry: EntryReport) -> str:
    """Each run's epochs to converge as a dot, with the RCP mean and the least acceptable mean."""
    rcp = entry.rcp
    if rcp is None or not rcp.evaluated or rcp.rcp_mean is None or rcp.min_epochs is None:
        return ""
    epochs = [e for e in rcp.run_epochs if e < 1e8]
    values = [*epochs, rcp.rcp_mean, rcp.min_epochs, rcp.submission_mean or rcp.rcp_mean]
    x = _scale(min(values) * 0.97, max(values) * 1.03, WIDTH)
    height = 110  # a row per label: the three means are often within a few pixels of each other
    parts = [f'<line x1="{PAD}" y1="60" x2="{WIDTH - PAD}" y2="60" stroke="#444"/>']
    for e in epochs:
        parts.append(f'<circle cx="{x(e):.1f}" cy="45" r="4" fill="#1f77b4"><title>{e:g}</title></circle>')
    marks = (
        ("RCP mean", rcp.rcp_mean, "#080"),
        ("least acceptable", rcp.min_epochs, "#b00"),
        ("submission mean", rcp.submission_mean, "#1f77b4"),
    )
    for i, (label, value, colour) in enumerate(marks):
        if value is None:
            continue
        parts.append(
            f'<line x1="{x(value):.1f}" y1="20" x2="{x(value):.1f}" y2="66" stroke="{colour}" stroke-dasharray="4 3"/>'
        )
        parts.append(
            f'<text x="{x(value):.1f}" y="{78 + i * 11}" font-size="10" fill="{colour}" '
            f'text-anchor="middle">{label} {value:.3f}</text>'
        )
    return f'<svg width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img">{"".join(parts)}</svg>'


def _findings_html(findings: Sequence[Finding]) -> str:
    if not findings:
        return '<p class="ok">No findings.</p>'
    rows = "".join(
        f'<tr><td class="{f.severity}">{f.severity}</td><td><code>{_e(f.where)}</code></td>'
        f"<td>{_e(f.rule)}</td><td>{_e(f.message)}</td><td>{_e(f.fix)}</td></tr>"
        for f in findings
    )
    return f'<div class="wide"><table><tr><th>severity</th><th>where</th><th>rule</th><th>what</th><th>fix</th></tr>{rows}</table></div>'


def _runs_html(entry: EntryReport) -> str:
    rows = []
    for r in entry.runs:
        cls = ' class="dropped"' if r.dropped else ""
        why = "" if r.dropped is None else f"dropped ({r.dropped})"
        epochs = "-" if r.epochs is None else f"{r.epochs:g}"
        rows.append(
            f"<tr{cls}><td><code>{_e(r.file)}</code></td><td class=n>{_num(r.minutes)}</td>"
            f"<td>{'yes' if r.compliant else 'no'}</td><td class=n>{epochs}</td><td>{why}</td></tr>"
        )
    head = "<tr><th>file</th><th>minutes</th><th>compliant</th><th>epochs</th><th>score</th></tr>"
    return f'<div class="wide"><table>{head}{"".join(rows)}</table></div>'


def _kwh(joules: float | None) -> str:
    return "-" if joules is None else f"{joules / J_PER_KWH:.6g}"


def _energy_html(entry: EntryReport) -> str:
    """The official summarizer's energy, or why there is none."""
    if entry.energy_j is None:
        return "<p>Energy: none (no power/ logs, or they could not be scored; see the findings).</p>"
    if entry.scaling == "strong":
        return f"<p>Energy to train: <b>{_kwh(entry.energy_j)} kWh</b> (olympic mean × RCP factor).</p>"
    per_kwh = "-" if entry.models_per_kwh is None else f"{entry.models_per_kwh:.6g}"
    return (
        f"<p>Energy per model (the summarizer's weak column): <b>{_kwh(entry.energy_j)} kWh</b>; all counted "
        f"models {_kwh(entry.energy_total_j)} kWh; <b>{per_kwh} models per kWh</b>.</p>"
    )


def _pruned_html(entry: EntryReport) -> str:
    """Weak scaling: the instances under pruned_results/, checked but never scored."""
    if not entry.pruned_runs:
        return ""
    rows = "".join(
        f"<tr><td><code>{_e(r.file)}</code></td><td class=n>{_num(r.minutes)}</td>"
        f"<td>{'yes' if r.compliant else 'no'}</td></tr>"
        for r in entry.pruned_runs
    )
    return (
        f"<h3>Pruned runs ({len(entry.pruned_runs)}, not scored)</h3>"
        f'<div class="wide"><table><tr><th>file</th><th>minutes</th><th>compliant</th></tr>{rows}</table></div>'
    )


def _entry_html(entry: EntryReport, index: int, ruleset: str) -> str:
    title = f"{entry.submitter} / {entry.system} / {entry.scaling} / {entry.benchmark}"
    if entry.scaling == "strong":
        score = (
            f"raw {_num(entry.score_raw_min)} min × RCP scaling factor {entry.rcp_scaling_factor:.6f} "
            f"= <b>{_num(entry.score_min)} min</b>"
        )
    else:
        score = (
            f"{entry.num_models} models of {entry.instance_scale} accelerators in "
            f"{_num(entry.score_raw_min)} min = <b>{_num(entry.models_per_min, 4)} models/min</b>"
        )
    rcp = "<p>No RCP check (open division or unknown benchmark).</p>"
    if entry.rcp is not None:
        r = entry.rcp
        rcp = (
            f"<p>RCP: <b>{_e(r.verdict)}</b> ({_e(r.message)}); batch size {_e(r.batch_size)}, reference "
            f"{_e(r.reference)}, RCP mean {_num(r.rcp_mean, 4)}, least acceptable {_num(r.min_epochs, 4)}, "
            f"submission mean {_num(r.submission_mean, 4)}, factor {r.scaling_factor:.6f}</p>{rcp_svg(entry)}"
        )
    target = convergence_target(ruleset, entry.benchmark)
    return (
        f'<section id="e{index}"><h2>{_e(title)}</h2><p>Division {_e(entry.division)}. {score}</p>'
        f"{_energy_html(entry)}<h3>Runs</h3>{_runs_html(entry)}{_pruned_html(entry)}"
        f"<h3>Convergence</h3>{convergence_svg(entry, target)}"
        f"<h3>Reference convergence points</h3>{rcp}<h3>Findings</h3>{_findings_html(entry.findings)}</section>"
    )


def _summary_html(report: CheckReport) -> str:
    rows = []
    for i, e in enumerate(report.entries):
        errors = sum(f.severity == "error" for f in e.findings)
        cls = "error" if errors else ("warning" if e.findings else "ok")
        rows.append(
            f'<tr><td><a href="#e{i}">{_e(e.submitter)}</a></td><td>{_e(e.system)}</td><td>{_e(e.scaling)}</td>'
            f"<td>{_e(e.benchmark)}</td><td class=n>{_num(e.score_raw_min)}</td><td class=n>{_num(e.score_min)}</td>"
            f"<td class=n>{_num(e.models_per_min, 4)}</td><td class=n>{len(e.runs)}</td>"
            f"<td class=n>{len(e.pruned_runs)}</td><td class=n>{_kwh(e.energy_j)}</td>"
            f"<td>{_e(e.rcp.verdict if e.rcp else '-')}</td>"
            f'<td class="{cls}">{errors} / {len(e.findings) - errors}</td></tr>'
        )
    head = (
        "<tr><th>submitter</th><th>system</th><th>scaling</th><th>benchmark</th><th>raw min</th>"
        "<th>score min</th><th>models/min</th><th>runs</th><th>pruned</th><th>energy kWh</th><th>RCP</th>"
        "<th>errors / warnings</th></tr>"
    )
    return f'<div class="wide"><table>{head}{"".join(rows)}</table></div>'


def report_html(report: CheckReport) -> str:
    errors = sum(f.severity == "error" for f in report.all_findings())
    verdict = (
        f'<p class="{"error" if errors else "ok"}">{"FAILED" if errors else "PASSED"}: {errors} error(s)</p>'
    )
    body = "".join(_entry_html(e, i, report.ruleset) for i, e in enumerate(report.entries))
    return keep_words(  # a cell never breaks a word at its hyphen or slash
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{generator_meta(GENERATOR)}<title>MLPerf HPC check</title>'
        f"<style>{STYLE}{WORDS_STYLE}</style></head><body><h1>MLPerf HPC check of {_e(report.root)}</h1>"
        f"<p>Ruleset {_e(report.ruleset)} ({_e(report.ruleset_reason)}).</p>{verdict}{_summary_html(report)}"
        f"<h2>Submission-wide findings</h2>{_findings_html(report.findings)}{body}</body></html>\n"
    )


def write_html_report(report: CheckReport, folder: Path) -> Path:
    """Write folder/index.html and return its path."""
    return atomic_write_text(Path(folder) / REPORT_NAME, report_html(report))
