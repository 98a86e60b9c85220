"""The HTML page of `mlhpc check --report DIR`, opened in a real browser (headless Chromium).

The page is rendered, its DOM after load is read back and the browser's console is watched: the
plots must be there as drawn elements and nothing may complain. The screenshot is the one in
docs/img/check_report.png (`MLHPC_UPDATE_DOCS_IMAGES=1 pytest tests/results/test_report_browser.py`
writes it there).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mlhpc.cli import main
from tests.helpers.browser import CHROMIUM, measured_layout, png_size, render, script_result

ROOT = Path(__file__).resolve().parents[2]
CLEMSON = ROOT / "tests" / "data" / "hpc_v3.0_openfold" / "Clemson"
DOCS_IMAGE = ROOT / "docs" / "img" / "check_report.png"
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
)


def test_check_report_renders_with_its_plots_and_no_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A real v3.0 entry (ten openfold runs, an RCP pass with a scaling factor), checked as a user would.
    shutil.copytree(CLEMSON, tmp_path / "Clemson")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "Clemson", "--ruleset", "3.0.0", "--report", "report"]) == 0
    capsys.readouterr()

    shown = render(tmp_path / "report" / "index.html", tmp_path / "check_report.png")

    assert shown.console == [], "the browser reported:\n" + "\n".join(shown.console)
    dom = shown.dom
    assert dom.count("<svg") == 2, "a convergence plot and an RCP plot"
    assert dom.count("<polyline") == 10, "one convergence curve per run"
    assert "target eval_accuracy &gt;= 0.8" in dom
    assert dom.count('class="dropped"') == 2 and "263.520317" in dom
    assert png_size(shown.screenshot) == (1000, 1560)
    assert shown.screenshot.stat().st_size > 20_000, "a blank page compresses to almost nothing"
    if os.environ.get("MLHPC_UPDATE_DOCS_IMAGES"):  # titled as a user's folder, not pytest's temporary one
        page = tmp_path / "report" / "index.html"
        neutral = tmp_path / "docs_page" / "index.html"
        neutral.parent.mkdir()
        neutral.write_text(
            page.read_text(encoding="utf-8").replace(str(tmp_path), "/data/hpc_results_v3.0"),
            encoding="utf-8",
        )
        docs = render(neutral, tmp_path / "docs_check_report.png")
        assert (
            docs.console == [] and "/data/hpc_results_v3.0/Clemson" in docs.dom and "pytest" not in docs.dom
        )
        DOCS_IMAGE.parent.mkdir(exist_ok=True)
        shutil.copyfile(docs.screenshot, DOCS_IMAGE)


def test_a_page_with_a_script_error_is_caught(tmp_path: Path) -> None:
    """The console watch can fail: the same rendering reports a broken script and a missing image."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>plot</p><img src='missing.png'>"
        "<script>console.error('drawn badly'); undefinedFunction();</script></body></html>",
        encoding="utf-8",
    )
    shown = render(page, tmp_path / "broken.png", 400, 300)
    text = "\n".join(shown.console)
    assert "drawn badly" in text
    assert "Uncaught ReferenceError: undefinedFunction is not defined" in text
    assert "<svg" not in shown.dom and "<p>plot</p>" in shown.dom


def test_check_report_and_compare_page_fit_1200_px(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check report of a real entry whose system folder has a 150-character name, and the compare
    page of our entry against a published round: no horizontal scroll of the page at 1200 px."""
    helmholtz = ROOT / "tests" / "data" / "hpc_v2.0_helmholtzai"
    long_system = "juwelsbooster_" + "x" * 136
    org = tmp_path / "HelmholtzAI"
    shutil.copytree(helmholtz / "HelmholtzAI", org)
    (org / "results" / "juwelsbooster_gpu_n2048_pytorch1.13").rename(org / "results" / long_system)
    (org / "systems" / "juwelsbooster_gpu_n2048_pytorch1.13.json").rename(
        org / "systems" / f"{long_system}.json"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(org), "--report", "report"]) in (0, 1)
    db = str(tmp_path / "store.sqlite")
    assert main(["results", "add", str(helmholtz), str(org), "--db", db]) == 0
    assert (
        main(
            [
                "results",
                "compare",
                f"ours/2.0.0/HelmholtzAI/{long_system}/strong/deepcam",
                "--all",
                "--db",
                db,
                "--report",
                "compare",
            ]
        )
        == 0
    )
    capsys.readouterr()
    for page in (tmp_path / "report" / "index.html", tmp_path / "compare" / "index.html"):
        layout = measured_layout(page, tmp_path)
        assert layout["width"] <= 1200 and layout["scroll"] <= 1200, (page, layout)
        assert layout["over"] == [], (page, layout)


TOKENS = """<script>
addEventListener('load', () => {
  const broken = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const words = /\\S+/g;
      let m;
      while ((m = words.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  const out = document.createElement('pre');
  out.id = 'broken';
  out.textContent = JSON.stringify(broken);
  document.body.appendChild(out);
});
</script>"""


def broken_tokens(page: Path, scratch: Path, width: int) -> list[str]:
    """Every word or number of a table cell that the browser, in a `width` px window, lays out on
    more than one line (a Range over the token whose client rects have two tops)."""
    return script_result(page, TOKENS, "broken", scratch / f"tokens_{page.parent.name}_{width}.html", width)


def test_the_token_measure_sees_a_broken_word(tmp_path: Path) -> None:
    """The measure can fail: a narrow cell that may break anywhere splits `strong` and `128`."""
    page = tmp_path / "narrow" / "index.html"
    page.parent.mkdir()
    page.write_text(
        "<!DOCTYPE html><html><body><table><tr><td style='width:2ch;max-width:2ch;overflow-wrap:anywhere'>"
        "strong 12345678</td></tr></table></body></html>",
        encoding="utf-8",
    )
    assert {"strong", "12345678"} <= set(broken_tokens(page, tmp_path, 800))


def test_no_cell_breaks_a_word_or_a_number_at_1280_and_800_px(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check report of a real entry (Clemson), of a round with a 150-character system name,
    and the compare page against that round: at 1280 and 800 px no word or number of any table
    cell is laid out over two lines (`stron/g`, `12/8` were)."""
    helmholtz = ROOT / "tests" / "data" / "hpc_v2.0_helmholtzai"
    org = tmp_path / "HelmholtzAI"
    shutil.copytree(helmholtz / "HelmholtzAI", org)
    long_system = "juwelsbooster_" + "x" * 136
    (org / "results" / "juwelsbooster_gpu_n2048_pytorch1.13").rename(org / "results" / long_system)
    (org / "systems" / "juwelsbooster_gpu_n2048_pytorch1.13.json").rename(
        org / "systems" / f"{long_system}.json"
    )
    shutil.copytree(CLEMSON, tmp_path / "Clemson")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "Clemson", "--ruleset", "3.0.0", "--report", "clemson"]) == 0
    assert main(["check", str(org), "--report", "helmholtz"]) in (0, 1)
    db = str(tmp_path / "store.sqlite")
    assert main(["results", "add", str(helmholtz), str(org), "--db", db]) == 0
    entry = f"ours/2.0.0/HelmholtzAI/{long_system}/strong/deepcam"
    assert main(["results", "compare", entry, "--all", "--db", db, "--report", "compare"]) == 0
    capsys.readouterr()
    for name in ("clemson", "helmholtz", "compare"):
        for width in (1280, 800):
            broken = broken_tokens(tmp_path / name / "index.html", tmp_path, width)
            assert broken == [], (name, width, broken[:20])
