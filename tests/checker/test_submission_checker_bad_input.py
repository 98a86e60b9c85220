"""Broken and hostile submissions: a finding each, never a crash, never a hang; and a fuzz test."""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mlhpc.submission_checker import check_submission
from mlhpc.submission_checker.compliance import MAX_RESULT_BYTES
from mlhpc.submission_checker.logparse import MAX_MLLOG_LINE_CHARS
from tests.helpers.cli import mlhpc_cli

SAMPLE = Path(__file__).parents[1] / "data" / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
HOREKA = "horeka_gpu_n512_pytorch1.13"
DEEPCAM = SAMPLE / "results" / HOREKA / "strong" / "deepcam"
FUZZ_SEED = 20231113
FUZZ_FILES = 30


def copy_system_json(source: Path, target: Path) -> None:
    """The sample's system description under another system folder, named as its logs name it
    ("128xNVIDIA DGX A100"), so that a clean copy has no log-vs-system finding."""
    text = source.read_text()
    target.write_text(text.replace(f'"{HOREKA}"', '"NVIDIA DGX A100"'))


@pytest.fixture
def make_org(tmp_path: Path) -> Callable[..., Path]:
    """An organisation with one strong deepcam entry (five real logs) and its system JSON."""

    def make(name: str = "Org", system: str = "sysA") -> Path:
        org = tmp_path / name
        results = org / "results" / system / "strong" / "deepcam"
        shutil.copytree(DEEPCAM, results)
        (org / "systems").mkdir()
        copy_system_json(SAMPLE / "systems" / f"{HOREKA}.json", org / "systems" / f"{system}.json")
        impl = org / "benchmarks" / "deepcam" / "implementations" / "pytorch"
        impl.mkdir(parents=True)
        (impl / "train.py").write_text("seed = 1\n")
        return org

    return make


def entry_dir(org: Path, system: str = "sysA") -> Path:
    return org / "results" / system / "strong" / "deepcam"


def rules_of(findings, path_end: str = "") -> set[tuple[str, str]]:
    return {(f.rule, f.severity) for f in findings if f.path.endswith(path_end)}


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text(encoding="latin-1")
    assert old in text, old
    path.write_text(text.replace(old, new, count), encoding="latin-1")


def test_symlinks_out_of_the_submission_are_not_followed(
    make_org: Callable[..., Path], tmp_path: Path
) -> None:
    org = make_org()
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(DEEPCAM / "result_4.txt", outside / "secret.txt")
    victim = entry_dir(org) / "result_4.txt"
    victim.unlink()
    victim.symlink_to(outside / "secret.txt")
    (org / "results" / "sysB").symlink_to(outside)
    loop = entry_dir(org) / "result_9.txt"
    loop.symlink_to(loop)
    report = check_submission(org, ruleset="2.0.0")
    (entry,) = report.entries
    links = [f for f in entry.findings if f.rule == "symlink"]
    assert {Path(f.path).name for f in links} == {"result_4.txt", "result_9.txt"}
    assert all(f.severity == "warning" for f in links)
    assert any("outside the submission" in f.message for f in links)
    assert any("loop" in f.message for f in links)
    assert ("symlink", "error") in rules_of(report.findings, "results/sysB")
    assert entry.runs[4].compliant is False
    assert entry.score_raw_min is None  # two runs dropped


def test_huge_result_file_is_not_read(make_org: Callable[..., Path]) -> None:
    org = make_org()
    huge = entry_dir(org) / "result_4.txt"
    with open(huge, "r+b") as handle:
        handle.truncate(MAX_RESULT_BYTES + 1)  # sparse: no disk, no time
    started = time.perf_counter()
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    assert time.perf_counter() - started < 30
    assert ("file-size", "warning") in rules_of(entry.findings, "result_4.txt")
    assert entry.score_raw_min is not None  # olympic scoring absorbs it


def test_a_very_long_mllog_line_is_not_given_to_the_official_parser(make_org: Callable[..., Path]) -> None:
    org = make_org()
    target = entry_dir(org) / "result_3.txt"
    with open(target, "a", encoding="latin-1") as handle:
        handle.write(':::MLLOG {"key": "x", "value": "' + "y" * (2 * MAX_MLLOG_LINE_CHARS) + '"}\n')
    started = time.perf_counter()
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    assert time.perf_counter() - started < 30
    (finding,) = [f for f in entry.findings if f.path.endswith("result_3.txt")]
    assert (finding.rule, finding.severity) == ("log-parse", "warning")
    assert "characters" in finding.message


def test_a_fifo_named_like_a_result_does_not_hang(make_org: Callable[..., Path]) -> None:
    org = make_org()
    os.mkfifo(entry_dir(org) / "result_7.txt")
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    assert len(entry.runs) == 5
    assert ("layout", "warning") in rules_of(entry.findings)


def test_timestamps_going_backwards(make_org: Callable[..., Path]) -> None:
    org = make_org()
    target = entry_dir(org) / "result_2.txt"
    lines = target.read_text(encoding="latin-1").splitlines(keepends=True)
    evals = [i for i, line in enumerate(lines) if '"eval_accuracy"' in line]
    lines[evals[0]], lines[evals[1]] = lines[evals[1]], lines[evals[0]]
    target.write_text("".join(lines), encoding="latin-1")
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    (finding,) = [f for f in entry.findings if f.rule == "timestamps"]
    # The later eval now sits first: the line after it (1-based evals[0] + 2) goes back in time.
    assert (finding.severity, finding.line) == ("warning", evals[0] + 2)


def test_run_stop_before_run_start_is_an_error(make_org: Callable[..., Path]) -> None:
    org = make_org()
    target = entry_dir(org) / "result_1.txt"
    stop = next(line for line in target.read_text().splitlines() if '"run_stop"' in line)
    edit(target, stop, stop.replace('"time_ms": 16', '"time_ms": 15'))
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    assert ("timestamps", "error") in rules_of(entry.findings, "result_1.txt")


def test_runs_of_one_entry_on_different_scales(make_org: Callable[..., Path]) -> None:
    org = make_org()
    edit(
        entry_dir(org) / "result_0.txt",
        '"key": "number_of_nodes", "value": 128',
        '"key": "number_of_nodes", "value": 64',
    )
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    (finding,) = [f for f in entry.findings if f.rule == "run-scale"]
    assert (
        finding.severity == "error" and "64 node(s)" in finding.message and "128 node(s)" in finding.message
    )


def test_seeds_are_checked_in_the_closed_division_only(make_org: Callable[..., Path]) -> None:
    org = make_org()
    target = entry_dir(org) / "result_3.txt"
    target.write_text("".join(x for x in target.read_text().splitlines(True) if '"key": "seed"' not in x))
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    (finding,) = [f for f in entry.findings if f.rule == "seed-missing"]
    assert (finding.severity, finding.path) == ("warning", "results/sysA/strong/deepcam")
    system = org / "systems" / "sysA.json"
    system.write_text(system.read_text().replace('"closed"', '"open"'))
    (entry,) = check_submission(org, ruleset="2.0.0").entries
    assert not [f for f in entry.findings if f.rule.startswith("seed")]
    assert entry.rcp is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            ('"number_of_nodes"                   : "128"', '"number_of_nodes": "many"'),
            "number_of_nodes='many'",
        ),
        (('"framework"                         : "', '"framework": 3, "x": "'), "framework=3"),
        (('"division"                          : "closed"', '"division": "secret"'), "division='secret'"),
    ],
)
def test_systems_json_fields_are_typed(
    make_org: Callable[..., Path], change: tuple[str, str], needle: str
) -> None:
    org = make_org()
    edit(org / "systems" / "sysA.json", *change)
    report = check_submission(org, ruleset="2.0.0")
    (finding,) = [f for f in report.findings if f.severity == "error"]
    assert finding.rule == "system-json" and needle in finding.message and finding.fix


def test_unknown_scaling_folder_and_benchmark(make_org: Callable[..., Path]) -> None:
    org = make_org()
    (org / "results" / "sysA" / "medium").mkdir()
    entry_dir(org).rename(entry_dir(org).with_name("minigo"))
    report = check_submission(org, ruleset="3.0.0")
    assert ("layout", "error") in rules_of(report.findings)
    assert ("benchmark-unknown", "error") in rules_of(report.entries[0].findings)


# --- fuzz ---------------------------------------------------------------------------------


def mutate(lines: list[str], rng: random.Random) -> list[str]:
    """A few random drops, duplicates, swaps and byte flips, then one line cut mid-JSON."""
    lines = list(lines)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(("drop", "duplicate", "swap", "flip"))
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        if op == "drop" and len(lines) > 2:
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "flip":
            text = lines[i]
            k = rng.randrange(len(text))
            lines[i] = text[:k] + rng.choice('\x00{}":,x9\n\xff ') + text[k + 1 :]
    mllog = [i for i, line in enumerate(lines) if ":::MLLOG {" in line]
    i = rng.choice(mllog)
    json_start = lines[i].index(":::MLLOG {") + len(":::MLLOG ")
    end = lines[i].rstrip().rindex("}")
    lines[i] = lines[i][: rng.randrange(json_start + 1, end)] + "\n"  # loses its closing brace
    return lines


@pytest.fixture
def fuzzed_round(tmp_path: Path) -> Path:
    rng = random.Random(FUZZ_SEED)
    originals = sorted(DEEPCAM.glob("result_*.txt"))
    round_dir = tmp_path / "round"
    for n in range(FUZZ_FILES // 5):
        org = round_dir / f"Org{n}"
        results = org / "results" / "sysA" / "strong" / "deepcam"
        results.mkdir(parents=True)
        (org / "systems").mkdir()
        shutil.copyfile(SAMPLE / "systems" / f"{HOREKA}.json", org / "systems" / "sysA.json")
        for i, source in enumerate(originals):
            lines = source.read_text(encoding="latin-1").splitlines(keepends=True)
            (results / f"result_{i}.txt").write_text("".join(mutate(lines, rng)), encoding="latin-1")
    return round_dir


def test_fuzzed_logs_give_findings_not_tracebacks(fuzzed_round: Path) -> None:
    report = check_submission(fuzzed_round, ruleset="2.0.0")
    assert len(report.entries) == FUZZ_FILES // 5
    for entry in report.entries:
        assert len(entry.runs) == 5
        for run in entry.runs:
            assert run.compliant is False  # every file has a cut line
            assert [f for f in entry.findings if f.path == run.file], run.file
        assert entry.score_raw_min is None
        assert ("score", "error") in {(f.rule, f.severity) for f in entry.findings}


def test_fuzzed_round_through_the_command_line(fuzzed_round: Path, tmp_path: Path) -> None:
    done = mlhpc_cli(["check", str(fuzzed_round), "--csv", str(tmp_path / "out.csv")], tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "FAILED" in done.stdout
