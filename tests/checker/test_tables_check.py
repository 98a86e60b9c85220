"""`mlhpc check`'s table at 80 and 120 columns: every score printed whole (never `0.45…`),
no line wider than the terminal, the names folded rather than cut, the left-out columns named,
and the verdict line repeating the score."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mlhpc.submission_checker.report import CheckReport, EntryReport
from mlhpc.submission_checker.table import fitted_table, scores_text

DATA = Path(__file__).parents[1] / "data" / "hpc_v3.0_weak"


def _check(columns: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "check", str(DATA)],
        capture_output=True,
        text=True,
        env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_the_scores_stay_whole_at_80_and_120_columns(columns: int) -> None:
    out = _check(columns)
    table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and all(len(line) <= columns for line in table)
    assert "…" not in out
    for score in ("487.562233", "34.415000"):  # the two weak entries' scores, in the table
        assert any(score in line for line in table), (score, out)
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("PASSED") and "487.562233 min" in verdict and "34.415000 min" in verdict
    assert "fugaku_82944xA64FX_tensorflow_closed" in out  # folded onto its own line, never cut
    if columns == 80:
        assert "left out to fit models/min, raw min, RCP" in out
    else:
        assert "models/min" in table[1] and "left out" not in out


def _entry(name: str, score: float | None) -> EntryReport:
    return EntryReport(
        submitter=name,
        system=name * 2,
        scaling="strong",
        benchmark="cosmoflow",
        runs=(),
        pruned_runs=(),
        score_raw_min=score,
        rcp=None,
        rcp_scaling_factor=1.0,
        score_min=score,
        models_per_min=None,
        findings=(),
    )


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(st.text(alphabet="abcdefghij_+.-", min_size=1, max_size=60), min_size=1, max_size=4),
    scores=st.lists(st.floats(min_value=0, max_value=1e7, allow_nan=False), min_size=4, max_size=4),
    width=st.integers(min_value=60, max_value=200),
)
def test_any_names_any_width_keep_every_score_whole(
    names: list[str], scores: list[float], width: int
) -> None:
    report = CheckReport(
        root="/x",
        ruleset="3.0.0",
        ruleset_reason="--ruleset",
        entries=tuple(_entry(n, s) for n, s in zip(names, scores, strict=False)),
    )
    console = Console(width=width, record=True, no_color=True)

    def cells(e: EntryReport) -> dict:
        score = f"{e.score_min:.6f}"
        return {
            "submitter": e.submitter,
            "system": e.system,
            "scaling": e.scaling,
            "benchmark": e.benchmark,
            "runs": "10",
            "raw min": score,
            "RCP": "-",
            "score min": score,
            "models/min": "-",
            "findings": "0",
        }

    console.print(fitted_table(report, console, cells, "t"))
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines()), text
    for e in report.entries:
        assert re.search(rf"(^|[ │]){re.escape(f'{e.score_min:.6f}')}([ │]|$)", text, re.M), (width, text)
    if len(names) == 1:
        assert scores_text(report) == f"; score {scores[0]:.6f} min"
