"""A campaign of fewer runs than a score needs is a success of its kind: `mlhpc run`'s own check
says what it is and exits 0, while `mlhpc check` and every other finding keep their exit code.
The entries are real MLPerf HPC v2.0 DeepCAM logs (tests/data), 5 of which make a score."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from mlhpc.campaign.options import RunOptions
from mlhpc.campaign.status import short_campaign_line
from mlhpc.submission_checker.command import check_command

SAMPLE = Path(__file__).parents[1] / "data" / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
HOREKA = "horeka_gpu_n512_pytorch1.13"


def make_org(root: Path, files: int) -> Path:
    """An organisation with one strong DeepCAM entry of the sample's first `files` logs."""
    org = root / "Org"
    results = org / "results" / "sysA" / "strong" / "deepcam"
    results.mkdir(parents=True)
    for i in range(files):
        source = SAMPLE / "results" / HOREKA / "strong" / "deepcam" / f"result_{i % 5}.txt"
        shutil.copyfile(source, results / f"result_{i}.txt")
    (org / "systems").mkdir()
    text = (SAMPLE / "systems" / f"{HOREKA}.json").read_text()
    (org / "systems" / "sysA.json").write_text(text.replace(f'"{HOREKA}"', '"NVIDIA DGX A100"'))
    impl = org / "benchmarks" / "deepcam" / "implementations" / "pytorch"
    impl.mkdir(parents=True)
    (impl / "README.md").write_text("deepcam\n")
    return org


def check(org: Path, short: bool) -> tuple[int, str]:
    console = Console(record=True, width=200, highlight=False)
    said = (
        (lambda found, required: f"{found} of {required} runs: not yet a scoreable entry") if short else None
    )
    status = check_command(org, ruleset="2.0.0", console=console, short_campaign=said)
    return status, console.export_text()


def test_two_of_five_runs_is_a_short_campaign_exit_0(tmp_path: Path) -> None:
    org = make_org(tmp_path, 2)
    status, text = check(org, short=True)
    assert "strong scaling needs exactly 5" in text  # the checker's finding stays in the table
    assert text.rstrip().endswith("2 of 5 runs: not yet a scoreable entry") and status == 0, text


def test_mlhpc_check_keeps_its_exit_code_on_the_same_entry(tmp_path: Path) -> None:
    status, text = check(make_org(tmp_path, 2), short=False)
    assert status == 1 and "not yet a scoreable entry" not in text, text


def test_another_finding_still_fails_a_short_campaign(tmp_path: Path) -> None:
    org = make_org(tmp_path, 2)
    folder = org / "results" / "sysA" / "strong" / "deepcam"
    shutil.copyfile(folder / "result_0.txt", folder / "result_1.txt")  # the same seed twice
    status, text = check(org, short=True)
    assert "seed-duplicate" in text
    assert status == 1 and "not yet a scoreable entry" not in text, text


def test_too_many_runs_is_not_short(tmp_path: Path) -> None:
    status, text = check(make_org(tmp_path, 6), short=True)
    assert status == 1 and "needs exactly 5" in text and "not yet" not in text, text


def test_a_full_entry_passes_without_the_line(tmp_path: Path) -> None:
    status, text = check(make_org(tmp_path, 5), short=True)
    assert status == 0 and "not yet" not in text, text


@pytest.mark.parametrize(
    ("scaling", "expected"),
    [
        (
            "strong",
            "2 of 10 runs: not yet a scoreable entry; run 8 more with `mlhpc run cosmoflow --config mini "
            "--out 'my runs' --seeds 10 loop.max_epochs=9 --resume`",
        ),
        ("weak", "2 of 10 models: not yet a scoreable entry; train all 10 at once with `mlhpc run"),
    ],
)
def test_the_line_names_the_command_that_finishes_it(scaling: str, expected: str) -> None:
    opts = RunOptions(benchmark="cosmoflow", out=Path("my runs"), overrides=("loop.max_epochs=9",))
    assert short_campaign_line(2, 10, scaling, opts).startswith(expected)


def test_the_slurm_check_jobs_flag_makes_a_short_campaign_exit_0(tmp_path: Path) -> None:
    """`mlhpc check --short-campaign` (the check job of `mlhpc run --slurm`): 0 on 2 of 5 runs, 1
    without the flag, and 1 with it when another finding fails."""
    from mlhpc.cli import main

    org = make_org(tmp_path, 2)
    assert main(["check", str(org), "--ruleset", "2.0.0", "--short-campaign"]) == 0
    assert main(["check", str(org), "--ruleset", "2.0.0"]) == 1
    six = make_org(tmp_path / "six", 6)  # too many runs is never short
    assert main(["check", str(six), "--ruleset", "2.0.0", "--short-campaign"]) == 1
