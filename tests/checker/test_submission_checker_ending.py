"""An ending that explains itself (issue 30): a smoke configuration's RCP line, the ruleset's origin,
and `mlhpc: error:` on every line `mlhpc check` cannot go on from."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from mlhpc.submission_checker import check_submission
from mlhpc.submission_checker.command import CAMPAIGN_RULESET, check_command
from mlhpc.submission_checker.rcp_checks import rcp_configs, smoke_batch
from tests.helpers.cli import mlhpc_cli, said_lines

V2 = Path(__file__).parents[1] / "data" / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
HOREKA_COSMOFLOW = V2 / "results" / "horeka_gpu_n512_pytorch1.13" / "strong" / "cosmoflow"


def cosmoflow_at(tmp_path: Path, batch: int, epochs_divided_by: int = 1) -> Path:
    """The published horeka cosmoflow entry (it converges faster than the RCP allows at batch 512)
    with every run's global_batch_size rewritten to `batch` and its epoch numbers divided (a mini
    run converges in a few epochs); the organisation's folder."""
    org = tmp_path / f"Org{batch}"
    entry = org / "results" / "sysA" / "strong" / "cosmoflow"
    shutil.copytree(HOREKA_COSMOFLOW, entry)
    for log in entry.glob("result_*.txt"):
        text = log.read_text(encoding="latin-1")
        text = text.replace('"global_batch_size", "value": 512', f'"global_batch_size", "value": {batch}')
        text = re.sub(r'"epoch_num": (\d+)', lambda m: f'"epoch_num": {int(m[1]) / epochs_divided_by}', text)
        log.write_text(text, encoding="latin-1")
    (org / "systems").mkdir()
    shutil.copyfile(V2 / "systems" / "horeka_gpu_n512_pytorch1.13.json", org / "systems" / "sysA.json")
    return org


def test_our_mini_batch_is_a_smoke_configuration_not_an_rcp_failure(tmp_path: Path) -> None:
    mini = smoke_batch("cosmoflow")
    assert mini == 16 and rcp_configs("cosmoflow")[0] == "rcp_32"
    (entry,) = check_submission(cosmoflow_at(tmp_path, mini, 10), ruleset="3.0.0").entries
    assert entry.rcp is not None and entry.rcp.verdict == "smoke", entry.rcp
    (finding,) = [f for f in entry.findings if f.rule == "rcp"]
    assert "smoke configuration" in finding.message and "no reference convergence point" in finding.message
    assert "fail" not in finding.message.lower()
    assert "rcp_32, rcp_64, rcp_128, rcp_512, rcp_1024" in finding.fix
    assert "mlhpc run cosmoflow --config rcp_32" in finding.fix and "bypass" not in finding.fix
    assert entry.rcp_scaling_factor == 1.0


@pytest.mark.parametrize("batch", [512, 2048])
def test_real_rcp_failures_still_fail(tmp_path: Path, batch: int) -> None:
    """512 has a reference the runs converge too fast for; 2048 is above every reference."""
    (entry,) = check_submission(cosmoflow_at(tmp_path, batch), ruleset="3.0.0").entries
    assert entry.rcp is not None and entry.rcp.verdict == "fail", entry.rcp
    (finding,) = [f for f in entry.findings if f.rule == "rcp"]
    assert "RCP test failed" in finding.message and "rcp-bypass" in finding.fix


def test_the_table_says_smoke_and_where_the_ruleset_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    org = cosmoflow_at(tmp_path, 16, 10)
    from rich.console import Console

    console = Console(width=400, highlight=False)
    check_command(org, ruleset="3.0.0", ruleset_reason=CAMPAIGN_RULESET, console=console)
    out = capsys.readouterr().out
    title = " ".join(out.split("Org16", 1)[1].split("┏")[0].split())  # rich wraps a title to the table
    assert title.startswith("(ruleset 3.0.0, mlhpc run's campaign ruleset") and "--ruleset" not in title
    row = next(line for line in out.splitlines() if "cosmoflow" in line and "sysA" in line)
    assert "smoke" in row and "fail" not in row
    check_command(org, ruleset="3.0.0", console=console)
    assert "(ruleset 3.0.0, --ruleset)" in " ".join(capsys.readouterr().out.split())
    check_command(org, console=console)
    detected = " ".join(capsys.readouterr().out.split())
    assert "--ruleset" not in detected and "detected from the logs" in detected


@pytest.mark.parametrize(
    "args",
    [
        ["check", "nowhere"],
        ["check", "{empty}"],
        ["check", "{org}", "--json", "{org}/inside.json"],
        ["check", "{org}", "--json", "/proc/no/such/dir/out.json"],
    ],
)
def test_every_check_error_is_one_mlhpc_line(tmp_path: Path, args: list[str]) -> None:
    org = cosmoflow_at(tmp_path, 512)
    (tmp_path / "empty").mkdir()
    proc = mlhpc_cli([a.format(org=org, empty=tmp_path / "empty") for a in args], tmp_path, 300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = said_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), proc.stderr


def test_pages_keep_to_their_width_without_a_browser(tmp_path: Path) -> None:
    """What test_report_browser measures at 1200 px, as rules of the pages (that test needs Chromium):
    every table in a box that scrolls on its own, plots that shrink, long names that wrap."""
    from mlhpc.results.compare import PAGE_STYLE
    from mlhpc.submission_checker.html_report import STYLE, report_html

    page = report_html(check_submission(cosmoflow_at(tmp_path, 512), ruleset="3.0.0"))
    assert page.count("<table>") == page.count('<div class="wide"><table>') > 0
    assert all('viewBox="0 0 ' in svg for svg in page.split("<svg ")[1:])
    for style in (STYLE, PAGE_STYLE):
        compact = "".join(style.split())
        assert ".wide{max-width:100%;overflow-x:auto}" in compact and "overflow-wrap:anywhere" in compact
        assert "max-width:100%;height:auto" in compact
