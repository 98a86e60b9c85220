"""`mlhpc results list` at 120 and 80 columns: no line wider than the terminal, every score and
every count whole (never `0.02…`), the long system names on one line at 120, the columns left out
named; compare_table the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mlhpc.common.display.tables import fitted_table

DATA = Path(__file__).parents[1] / "data" / "hpc_v3.0_weak"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("store") / "results.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "results", "add", str(DATA), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return db


@pytest.mark.parametrize("columns", [120, 80])
def test_results_list_fits_and_keeps_its_numbers(store: Path, columns: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "results", "list", "--db", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), proc.stdout
    assert "…" not in proc.stdout
    for number in ("0.02051", "0.4649", "2048", "128"):  # the weak scores and the accelerators
        assert any(f" {number} " in line for line in lines), (number, proc.stdout)
    if columns == 120:
        assert any("fugaku_82944xA64FX_tensorflow_closed" in line for line in lines)
        assert any("weak" in line for line in lines)  # scaling kept at 120
    assert "left out to fit:" in proc.stdout


@settings(max_examples=50, deadline=None)
@given(
    words=st.lists(st.text(alphabet="ab_-.x ", min_size=1, max_size=50), min_size=3, max_size=3),
    numbers=st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=2, max_size=2),
    width=st.integers(min_value=40, max_value=200),
)
def test_any_text_any_width_keeps_each_number_on_one_line(
    words: list[str], numbers: list[float], width: int
) -> None:
    texts = [f"{n:.6g}" for n in numbers]
    table = fitted_table(
        "t", ("a", "b", "c", "n1", "n2"), [[*words, *texts]], width, numbers=("n1", "n2"), droppable=("c",)
    )
    console = Console(width=width, record=True, no_color=True)
    console.print(table)
    out = console.export_text()
    assert all(len(line) <= width for line in out.splitlines()), out
    for text in texts:
        assert any(f" {text} " in line for line in out.splitlines()), (text, out)


def test_results_add_stores_the_folders_that_exist_and_names_each_missing_one(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    missing = [tmp_path / "hpc_results_v9.9", tmp_path / "typo"]
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "results", "add", str(missing[0]), str(DATA), str(missing[1]), "--db", str(db)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "stored 2 entries" in proc.stdout
    for folder in missing:
        assert f"mlhpc: warning: {folder} is not a folder; skipped" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"mlhpc: warning: not stored (not a folder): {missing[0]}, {missing[1]}; fix the path and add it again"
    )
    listed = subprocess.run(
        [sys.executable, "-m", "mlhpc", "results", "list", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "2 entries" in listed.stdout
    only_missing = subprocess.run(
        [sys.executable, "-m", "mlhpc", "results", "add", str(missing[1]), "--db", str(tmp_path / "other.sqlite")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert only_missing.returncode == 2 and not (tmp_path / "other.sqlite").exists()


def test_the_compare_plot_marks_unlike_entries_in_the_plot(tmp_path: Path) -> None:
    """Unlike entries are hollow markers with their own legend entry; like ones filled; a smoke
    entry's star says it is unlike all."""
    from mlhpc.results.compare import _plot

    def entry(id_: int, accelerators: int) -> dict:
        return {
            "id": id_, "ruleset": "3.0.0", "origin": "published", "submitter": "s", "system": f"sys{id_}",
            "scaling": "strong", "benchmark": "cosmoflow", "accelerators": accelerators, "rcp_verdict": "pass",
            "samples_per_s_per_accelerator": 10.0 * id_, "staging_share": 0.1, "epochs": 5.0,
        }  # fmt: skip

    ours = {**entry(9, 1), "rcp_verdict": "smoke", "origin": "ours"}
    fig = _plot(ours, [entry(1, 512), entry(2, 4)], frozenset({1}))
    ax = fig.axes[0]
    hollow = [c for c in ax.collections if len(c.get_offsets()) and c.get_facecolors().size == 0]
    filled = [c for c in ax.collections if len(c.get_offsets()) and c.get_facecolors().size > 0]
    assert [list(c.get_offsets()[0]) for c in hollow] == [[512, 10.0]]
    assert [512, 10.0] not in [list(c.get_offsets()[0]) for c in filled]
    labels = fig.axes[-1].get_legend().get_texts()
    texts = [t.get_text() for t in labels]
    assert "hollow: unlike (other scale or config)" in texts
    assert any("smoke config: unlike all" in t for t in texts)
    plain = _plot(entry(9, 1), [entry(2, 4)])
    assert "hollow: unlike (other scale or config)" not in [
        t.get_text() for t in plain.axes[-1].get_legend().get_texts()
    ]
