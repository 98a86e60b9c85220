"""The checker beyond the official tools: pruned weak-scaling logs and claims that must add up.

Real v3.0 weak-scaling logs (tests/data/hpc_v3.0_weak, see its NOTICE.md) and copies of them
broken one thing at a time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.submission_checker import CheckReport, check_submission

SAMPLE = Path(__file__).parents[1] / "data" / "hpc_v3.0_weak"
FUJITSU = "Fujitsu+RIKEN"
FUGAKU = "fugaku_82944xA64FX_tensorflow_closed"
FUGAKU_ENTRY = Path(FUJITSU) / "results" / FUGAKU / "weak" / "cosmoflow"
EOS = "eos_n256_ngc23.09_pytorch"
EOS_ENTRY = Path("NVIDIA") / "results" / EOS / "weak" / "openfold"
# Kept instances whose seed one of the pruned ones also has (seed -> kept file).
SHARED_SEEDS = {
    "result_2.txt",
    "result_97.txt",
    "result_211.txt",
    "result_435.txt",
    "result_493.txt",
    "result_528.txt",
}


@pytest.fixture(scope="module")
def sample_report() -> CheckReport:
    return check_submission(SAMPLE, ruleset="3.0.0")


@pytest.fixture
def sample_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "round"
    shutil.copytree(SAMPLE, copy)
    return copy


def by_rule(report: CheckReport, rule: str) -> list:
    return [f for f in report.all_findings() if f.rule == rule]


# --- pruned results ---------------------------------------------------------------------


def test_pruned_logs_are_checked_and_counted_not_scored(sample_report: CheckReport) -> None:
    entry = sample_report.entry(FUGAKU, "weak", "cosmoflow")
    assert len(entry.runs) == 10 and entry.num_models == 10
    assert len(entry.pruned_runs) == 11
    assert {r.dropped for r in entry.pruned_runs} == {"pruned"}
    assert all(r.file.startswith(f"{FUGAKU_ENTRY.as_posix()}/pruned_results/") for r in entry.pruned_runs)
    # Ten pruned logs are compliant; result_648.txt stops before run_stop.
    assert sum(r.compliant for r in entry.pruned_runs) == 10
    # pruned_results/ is part of the layout now, not an unexpected file.
    assert not [f for f in entry.findings if f.rule == "layout"]
    (finding,) = [f for f in entry.findings if f.rule == "pruned-log"]
    assert finding.path == f"{FUGAKU_ENTRY.as_posix()}/pruned_results/result_648.txt"
    assert "run_stop" in finding.message and finding.severity == "warning"
    assert entry.to_json()["pruned_runs"][0]["dropped"] == "pruned"


def test_a_kept_instance_sharing_a_pruned_seed_is_named(sample_report: CheckReport) -> None:
    entry = sample_report.entry(FUGAKU, "weak", "cosmoflow")
    found = [f for f in entry.findings if f.rule == "seed-pruned"]
    assert {Path(f.path).name for f in found} == SHARED_SEEDS
    assert all(f.line == 10 and "pruned_results/result_" in f.message for f in found)


def test_a_corrupt_pruned_log_is_a_finding_not_a_traceback(sample_copy: Path) -> None:
    pruned = sample_copy / FUGAKU_ENTRY / "pruned_results"
    (pruned / "result_46.txt").write_bytes(b"\x00\xff:::MLLOG {not json\n")
    (pruned / "result_55.txt").write_text("")
    report = check_submission(sample_copy, ruleset="3.0.0")
    entry = report.entry(FUGAKU, "weak", "cosmoflow")
    named = {Path(f.path).name for f in entry.findings if f.rule == "pruned-log"}
    assert named == {"result_46.txt", "result_55.txt", "result_648.txt"}
    # The score does not depend on pruned logs.
    clean = check_submission(SAMPLE, ruleset="3.0.0").entry(FUGAKU, "weak", "cosmoflow")
    assert entry.score_min == clean.score_min and entry.num_models == clean.num_models


def test_pruned_results_in_a_strong_entry_is_unexpected(tmp_path: Path) -> None:
    org = tmp_path / "Org"
    shutil.copytree(SAMPLE / FUJITSU / "systems", org / "systems")
    strong = org / "results" / FUGAKU / "strong" / "cosmoflow"
    shutil.copytree(SAMPLE / FUGAKU_ENTRY, strong)
    report = check_submission(org, ruleset="3.0.0")
    entry = report.entry(FUGAKU, "strong", "cosmoflow")
    assert entry.pruned_runs == ()
    (layout,) = [f for f in entry.findings if f.rule == "layout"]
    assert "pruned_results" in layout.message


def test_stray_files_in_pruned_results_and_a_link_out(sample_copy: Path, tmp_path: Path) -> None:
    pruned = sample_copy / FUGAKU_ENTRY / "pruned_results"
    (pruned / "notes.md").write_text("why we pruned\n")
    outside = tmp_path / "elsewhere.txt"
    shutil.copyfile(pruned / "result_46.txt", outside)
    (pruned / "result_999.txt").symlink_to(outside)
    report = check_submission(sample_copy, ruleset="3.0.0")
    layout = [f for f in report.all_findings() if f.rule == "layout"]
    assert any("notes.md" in f.message for f in layout)
    (link,) = [f for f in report.all_findings() if f.path.endswith("pruned_results/result_999.txt")]
    assert link.rule == "pruned-log" and "symbolic link" in link.message
    assert outside.read_bytes()  # never touched


def test_the_check_reads_json_from_the_command_line(sample_copy: Path, tmp_path: Path) -> None:
    from mlhpc.submission_checker import check_command

    out = tmp_path / "out.json"
    check_command(sample_copy, ruleset="3.0.0", json_path=out)
    entries = json.loads(out.read_text())["entries"]
    fugaku = next(e for e in entries if e["system"] == FUGAKU)
    assert len(fugaku["pruned_runs"]) == 11


# --- claims that must add up ------------------------------------------------------------


def test_instances_that_cannot_fit_in_the_system_get_a_scale_finding(sample_report: CheckReport) -> None:
    entry = sample_report.entry(EOS, "weak", "openfold")
    (claim,) = [f for f in entry.findings if f.rule == "scale-claim"]
    assert claim.severity == "warning" and claim.path == EOS_ENTRY.as_posix()
    assert "16 of 16 instances" in claim.message and "256 node(s) × 8 accelerator(s)" in claim.message
    assert (
        "4096 nodes (32768 accelerators)" in claim.message and "256 nodes × 8 accelerators" in claim.message
    )
    assert entry.score_min is not None  # the score stands as the summarizer computes it
    # Fujitsu: 10 kept + 11 pruned instances of 128 nodes fit in 82,944.
    fugaku = sample_report.entry(FUGAKU, "weak", "cosmoflow")
    assert not [f for f in fugaku.findings if f.rule == "scale-claim"]


def test_instances_one_after_another_fit(sample_copy: Path) -> None:
    """Sixteen instances that each use the whole system fit when they run one after another."""
    folder = sample_copy / EOS_ENTRY
    hour_ms = 3_600_000
    for i, path in enumerate(sorted(folder.glob("result_*.txt"))):
        lines = []
        for text in path.read_text(encoding="latin-1").splitlines(keepends=True):
            if ":::MLLOG " in text:
                head, _, body = text.partition(":::MLLOG ")
                record = json.loads(body)
                record["time_ms"] = record["time_ms"] + i * 100 * hour_ms
                text = head + ":::MLLOG " + json.dumps(record) + "\n"
            lines.append(text)
        path.write_text("".join(lines), encoding="latin-1")
    report = check_submission(sample_copy, ruleset="3.0.0")
    assert not by_rule(report, "scale-claim")


def test_logs_that_describe_another_system_are_named(sample_copy: Path) -> None:
    system = sample_copy / FUJITSU / "systems" / f"{FUGAKU}.json"
    desc = json.loads(system.read_text())
    desc.update(division="open", number_of_nodes="64", accelerators_per_node="4", submitter="Other")
    system.write_text(json.dumps(desc))
    (sample_copy / FUJITSU).rename(sample_copy / "Other")  # "Fujitsu" names neither folder nor submitter
    report = check_submission(sample_copy, ruleset="3.0.0")
    entry = report.entry(FUGAKU, "weak", "cosmoflow")
    messages = [f.message for f in entry.findings if f.rule == "log-vs-system"]
    assert len(messages) == 4, messages
    for key, shown in (
        ("submission_org", "'Fujitsu' in 21 log(s)"),
        ("submission_division", "'closed' in 21 log(s)"),
        ("number_of_nodes", "128 in 21 log(s)"),
        ("accelerators_per_node", "0 in 21 log(s)"),
    ):
        assert any(m.startswith(f"the logs' {key} disagrees") and shown in m for m in messages), key
    # The published description agrees with the logs (the org "Fujitsu" is part of "Fujitsu/RIKEN").
    assert not [
        f
        for f in check_submission(SAMPLE, ruleset="3.0.0").all_findings()
        if f.rule == "log-vs-system" and f.path.startswith(FUJITSU)
    ]


def test_placeholders_and_the_wrong_platform(sample_report: CheckReport) -> None:
    (platform,) = [
        f for f in sample_report.entry(EOS, "weak", "openfold").findings if f.rule == "log-vs-system"
    ]
    assert (
        "submission_platform" in platform.message and "'256xNVIDIA DGX H100' in 16 log(s)" in platform.message
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True),
        st.text(max_size=40),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    ),
    key=st.sampled_from(
        [
            "submission_org",
            "submission_platform",
            "submission_division",
            "submission_status",
            "number_of_nodes",
            "accelerators_per_node",
        ]
    ),
    field=st.sampled_from(
        ["submitter", "system_name", "division", "status", "number_of_nodes", "accelerators_per_node"]
    ),
)
def test_hostile_values_in_logs_and_description_give_findings_not_tracebacks(
    tmp_path_factory: pytest.TempPathFactory, value: object, key: str, field: str
) -> None:
    from mlhpc.submission_checker.claims import check_logs_against_system, check_scale_claim
    from mlhpc.submission_checker.compliance import LogAnalysis
    from mlhpc.submission_checker.layout_checks import EntryDir, SystemDesc
    from mlhpc.submission_checker.logparse import parse_log

    folder = tmp_path_factory.mktemp("hostile")
    log = folder / "result_0.txt"
    record = {
        "namespace": "",
        "time_ms": 1.0,
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": {},
    }
    stop = {**record, "key": "run_stop", "time_ms": 2.0, "value": None}
    start = {**record, "key": "run_start", "value": None}
    nodes = {**record, "key": "number_of_nodes", "value": 4}
    log.write_text("".join(":::MLLOG " + json.dumps(r) + "\n" for r in (record, nodes, start, stop)))
    analysis = LogAnalysis(str(log), True, (), parse_log(log))
    desc = json.loads((SAMPLE / FUJITSU / "systems" / f"{FUGAKU}.json").read_text())
    desc[field] = value
    for scaling in ("strong", "weak"):
        entry = EntryDir(folder, "sys", scaling, "cosmoflow", (log,))
        findings = check_logs_against_system(entry, [analysis], SystemDesc(desc, ()))
        findings += check_scale_claim(entry, [analysis] * 3, SystemDesc(desc, ()))
        assert all(f.rule in {"log-vs-system", "scale-claim"} and f.message for f in findings)


# --- the ruleset from every signal ------------------------------------------------------


def _sniff(day: str, benchmark: str = "cosmoflow", staging: bool = False):
    from datetime import datetime, timezone

    from mlhpc.submission_checker.logparse import LogSniff

    start = datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp() * 1000
    return LogSniff(benchmark, start, staging)


KNOWN = ["1.0.0", "2.0.0", "3.0.0"]


def test_republished_logs_take_the_round_the_folder_names() -> None:
    from mlhpc.submission_checker import detect_ruleset

    old = [_sniff("2021-10-20"), _sniff("2021-10-21")]
    # Logs of 2021 alone fit 1.0.0 (the earliest round they can belong to) ...
    assert detect_ruleset(old, KNOWN, "3.0.0").ruleset == "1.0.0"
    # ... but a folder named for v3.0 holds a v3.0 submission, and the reason says so.
    choice = detect_ruleset(old, KNOWN, "3.0.0", "hpc_results_v3.0")
    assert choice.ruleset == "3.0.0"
    assert choice.reason.startswith("the folder name 'v3.0' decided; the logs allow 1.0.0 or later")
    # A folder naming an older round than the logs allow does not win.
    new = [_sniff("2023-10-05", "openfold", staging=True)]
    choice = detect_ruleset(new, KNOWN, "3.0.0", "results-v1.0")
    assert choice.ruleset == "3.0.0" and "older than they allow" in choice.reason
    # Every kind of signal is named.
    reason = detect_ruleset([*old, *new], KNOWN, "3.0.0").reason
    for signal in ("benchmark openfold -> 3.0.0", "staging before run_start -> 3.0.0", "2023-10-05 -> 3.0.0"):
        assert signal in reason
    # Names that are no round, or an unknown one, say nothing.
    for name in ("perlmutter_10x128x4_ngc21.09_mxnet", "hpc_results_v9.0", "eos_n256", "", None):
        assert detect_ruleset(old, KNOWN, "3.0.0", name).ruleset == "1.0.0", name


def test_a_v3_organisation_checked_alone_is_scored_under_3_0_0(tmp_path: Path) -> None:
    round_folder = tmp_path / "hpc_results_v3.0"
    shutil.copytree(SAMPLE / FUJITSU, round_folder / FUJITSU)
    report = check_submission(round_folder / FUJITSU)
    assert report.ruleset == "3.0.0" and "folder name 'v3.0' decided" in report.ruleset_reason
    plain = tmp_path / "plain"
    shutil.copytree(SAMPLE / FUJITSU, plain / FUJITSU)
    assert check_submission(plain / FUJITSU).ruleset == "1.0.0"
