"""`mlhpc characterize` as a user runs it: the full configs' analytic level against the published
Table II, a mini's every level on this machine with its page opened in headless Chromium, the
comparison page, and bad input refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlhpc.characterize.reference import PUBLISHED
from tests.helpers.browser import CHROMIUM, png_size, render
from tests.helpers.cli import mlhpc, one_error_line

ROOT = Path(__file__).resolve().parents[2]
DOCS_IMAGES = ROOT / "docs" / "img"


def characterize(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return mlhpc("characterize", *args, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def full_analytic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The analytic level of both full configs (the meta device: seconds, no data)."""
    root = tmp_path_factory.mktemp("full")
    outs = {}
    for name in PUBLISHED:
        proc = characterize(name, "--config", "full", "--analytic", "--out", str(root / name), cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[name] = root / name
    return outs


@pytest.mark.parametrize("benchmark", sorted(PUBLISHED))
def test_full_config_analytic_level_beside_table_ii(full_analytic: dict[str, Path], benchmark: str) -> None:
    report = json.loads((full_analytic[benchmark] / "characterize.json").read_text())
    assert report["format"] == "mlhpc-characterize/1"
    assert set(report["skipped"]) == {"operators", "roofline", "memory", "io", "communication"}
    analytic = report["analytic"]
    assert analytic["device"] == "meta"
    assert analytic["forward_flops_per_sample"] == analytic["counter_forward_flops_per_sample"]
    rows = {row["quantity"]: row for row in report["published"]["rows"]}
    # The paper's sample is the model's input at 16 bits a value: the same tensor, exactly.
    assert rows["sample size"]["ratio"] == pytest.approx(1.0, abs=1e-12)
    # Layer formulas give fewer FLOPs than Nsight's measurement (the paper: about half); never more.
    assert 0.4 < rows["FLOPs per sample"]["ratio"] < 1.0
    for row in report["published"]["rows"]:
        assert row["why"], row
    page = (full_analytic[benchmark] / "characterize.html").read_text()
    assert "Against the published characterization" in page and "doi:10.1109/PMBS54543.2021.00007" in page


def test_a_config_without_published_figures_has_no_comparison(tmp_path: Path) -> None:
    proc = characterize("cosmoflow", "--config", "mini", "--analytic", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "o" / "characterize.json").read_text())["published"] is None


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
def test_mini_every_level_and_its_page_in_a_browser(full_analytic: dict[str, Path], tmp_path: Path) -> None:
    """cosmoflow mini, every level on this machine; the page drawn by Chromium with its three plots
    and nothing in the console; the comparison against the full config's analytic level too."""
    out = tmp_path / "mini"
    proc = characterize(
        "cosmoflow", "--config", "mini", "--out", str(out), "--steps", "2", "--io-samples", "4", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "USDT" not in proc.stderr and "gpuGetDeviceCount" not in proc.stderr, "the profiler's own noise"
    report = json.loads((out / "characterize.json").read_text())
    assert report["skipped"] == {}
    comm = report["communication"]
    assert comm["allreduce_bytes_per_step"] == comm["analytic_allreduce_bytes"] == report["analytic"]["allreduce_bytes_per_step"]
    for point in report["memory"]["points"]:
        assert point["categorized_bytes"] == pytest.approx(point["measured_peak_bytes"], rel=0.05)
    assert report["io"]["samples"] == 4 and report["io"]["first_touch"]["latency_p50_s"] > 0
    assert not list(out.glob(".characterize-data-*")), "the generated samples were left behind"

    shown = render(out / "characterize.html", tmp_path / "mini.png")
    assert shown.console == [], "the browser reported:\n" + "\n".join(shown.console)
    assert shown.dom.count("<svg") == 3, "operators, roofline and memory plots"
    for anchor in ("analytic", "operators", "roofline", "memory", "io", "communication"):
        assert f'id="{anchor}"' in shown.dom
    assert png_size(shown.screenshot) == (1000, 1560) and shown.screenshot.stat().st_size > 20_000

    proc = characterize("--compare", str(out), str(full_analytic["cosmoflow"]), "--out", str(tmp_path / "cmp"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    compared = render(tmp_path / "cmp" / "compare.html", tmp_path / "compare.png")
    assert compared.console == [] and "training FLOPs" in compared.dom
    assert 'id="analytic-per-sample"' in compared.dom and 'id="operators"' in compared.dom
    if os.environ.get("MLHPC_UPDATE_DOCS_IMAGES"):  # the whole page, titled as a user's folder
        neutral = tmp_path / "docs_page" / "characterize.html"
        neutral.parent.mkdir()
        neutral.write_text((out / "characterize.html").read_text().replace(str(out), "char/cosmoflow-cpu"))
        docs = render(neutral, tmp_path / "docs.png", height=4200)
        assert docs.console == [] and "pytest" not in docs.dom
        shutil.copyfile(docs.screenshot, DOCS_IMAGES / "characterize_cosmoflow_mini.png")


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "characterize.json").write_text('{"format": "mlhpc-characterize/1", "benchmark": 1}')
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "characterize.json").write_text(
        json.dumps({"format": "mlhpc-characterize/1", "benchmark": "x", "config": "y", "system": 3, "analytic": {}})
    )
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "characterize.html").write_text("<html>someone else's page</html>")
    cases = [
        (("--compare", str(fake), str(fake), "--out", str(tmp_path / "c")), "no 'config'"),
        (("--compare", str(odd), str(odd), "--out", str(tmp_path / "c")), "not laid out as mlhpc characterize"),
        (("--compare", str(tmp_path / "missing"), str(fake), "--out", str(tmp_path / "c")), "not a readable"),
        (("cosmoflow", "--compare", str(fake), str(fake), "--out", str(tmp_path / "c")), "takes no benchmark"),
        (("--out", str(tmp_path / "c")), "name a benchmark"),
        (("cosmoflow", "--steps", "0", "--out", str(tmp_path / "c")), "--steps 0"),
        (("cosmoflow", "--device", "tpu", "--out", str(tmp_path / "c")), "--device 'tpu'"),
        (("cosmoflow", "--config", "huge", "--out", str(tmp_path / "c")), "no config 'huge'"),
        (("cosmoflow", "--analytic", "--out", str(tmp_path / "theirs")), "not a page of mlhpc characterize"),
        (("deepcam", "--config", "full", "--batch-size", "64", "--out", str(tmp_path / "c")), "a step needs about"),
        (("cosmoflow", "--memory-batches", "2,0", "--out", str(tmp_path / "c")), "at least 1"),
        (("aiperf", "--analytic", "--out", str(tmp_path / "c")), "aiperf is an AutoML search"),
    ]
    for args, needle in cases:
        one_error_line(characterize(*args, cwd=tmp_path), needle)
    assert (tmp_path / "theirs" / "characterize.html").read_text() == "<html>someone else's page</html>"
    assert not (tmp_path / "c").exists()
