"""The RCP decision, the scaling factor and ruleset detection, against the official tools.

Expected numbers come from the official `mlperf_logging.result_summarizer` on the published
rounds (see the NOTICE.md of each sample); the official RCP checker also runs here, on scratch
copies, because it writes scaling.json into the folder it checks.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlhpc.common.vocabulary import ruleset_key
from mlhpc.submission_checker import CheckReport, RcpRead, check_rcp, check_submission, detect_ruleset
from mlhpc.submission_checker.logparse import LogSniff, parse_log
from mlhpc.submission_checker.ruleset import log_signals

DATA = Path(__file__).parents[1] / "data"
V1 = DATA / "hpc_v1.0_ncsa" / "NCSA"
V2 = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI"
V3 = DATA / "hpc_v3.0_openfold"
NCSA_OC20 = V1 / "results" / "halv100_n16_pt1.7.1" / "strong" / "oc20"
HOREKA_COSMOFLOW = V2 / "results" / "horeka_gpu_n512_pytorch1.13" / "strong" / "cosmoflow"
JUWELS_OC20 = V2 / "results" / "juwelsbooster_gpu_n512_pytorch1.13" / "strong" / "oc20"
HOREKA_DEEPCAM = V2 / "results" / "horeka_gpu_n512_pytorch1.13" / "strong" / "deepcam"
CLEMSON = V3 / "Clemson" / "results" / "18xR750-2xA100-PCIe-80GB" / "strong" / "openfold"
HPE = V3 / "HPE+LBNL" / "results" / "perlmutter_224x4" / "strong" / "openfold"

# (folder, ruleset) -> the official summarizer's (raw, RCP scaling factor, scaled) in minutes.
OFFICIAL = {
    (NCSA_OC20, "1.0.0"): (1021.8025555555555, 1.0394736842105263, 1062.1368669590643),
    (JUWELS_OC20, "2.0.0"): (38.167550000000006, 1.0167525773195876, 38.80695483247423),
    (HOREKA_DEEPCAM, "2.0.0"): (4.566155555555556, 1.0, 4.566155555555556),
    (HOREKA_COSMOFLOW, "2.0.0"): (5.4943375, 1.0, 5.4943375),
    (CLEMSON, "3.0.0"): (257.55831875, 1.0231481481481484, 263.52031686921305),
    (HPE, "3.0.0"): (14.64643125, 1.0, 14.64643125),
}


def digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def round_v3() -> Iterator[CheckReport]:
    before = digest(V3)
    yield check_submission(V3)  # ruleset detected
    assert digest(V3) == before


@pytest.fixture(scope="module")
def ncsa() -> CheckReport:
    return check_submission(V1)


def entry_of(report: CheckReport, folder: Path):
    system, scaling, benchmark = folder.parts[-3:]
    return report.entry(system, scaling, benchmark, submitter=folder.parents[3].name)


@pytest.fixture
def quiet_official() -> Iterator[None]:
    logging.disable(logging.CRITICAL)  # the official RCP checker logs every step
    yield
    logging.disable(logging.NOTSET)


# --- published entries ------------------------------------------------------------------


def test_v1_entry_with_a_scaling_factor_is_scored_as_published(ncsa: CheckReport) -> None:
    assert (ncsa.ruleset, ncsa.ruleset_reason) == (
        "1.0.0",
        "the folder name 'v1.0' decided; the logs allow 1.0.0 or later (a run started on 2021-10-18 -> 1.0.0)",
    )
    raw, factor, scaled = OFFICIAL[(NCSA_OC20, "1.0.0")]
    entry = entry_of(ncsa, NCSA_OC20)
    assert entry.score_raw_min == pytest.approx(raw, abs=1e-9)
    assert entry.rcp_scaling_factor == factor
    assert entry.score_min == pytest.approx(scaled, abs=1e-9)
    assert entry.rcp is not None and (entry.rcp.verdict, entry.rcp.message) == ("pass", "RCP found")
    assert entry.rcp.reference == "oc20_ref_256"


def test_v3_round_is_detected_and_scored_as_published(round_v3: CheckReport) -> None:
    assert round_v3.ruleset == "3.0.0"
    assert round_v3.ruleset_reason.startswith("the folder name 'v3.0' decided; the logs allow 3.0.0")
    for folder in (CLEMSON, HPE):
        raw, factor, scaled = OFFICIAL[(folder, "3.0.0")]
        entry = entry_of(round_v3, folder)
        assert entry.score_raw_min == pytest.approx(raw, abs=1e-9)
        assert entry.rcp_scaling_factor == factor
        assert entry.score_min == pytest.approx(scaled, abs=1e-9)
    assert not round_v3.has_errors


def test_published_scaling_json_agrees_with_the_rcp_check(round_v3: CheckReport) -> None:
    # Clemson's folder carries the scaling.json the review left (1.0231481481481484): no finding.
    clemson = entry_of(round_v3, CLEMSON)
    assert (CLEMSON / "scaling.json").is_file()
    assert not [f for f in clemson.findings if f.rule in ("scaling-json", "rcp")]


def test_failed_interpolation_is_a_warning_that_says_the_bypass(round_v3: CheckReport) -> None:
    hpe = entry_of(round_v3, HPE)
    assert hpe.rcp is not None
    assert (hpe.rcp.verdict, hpe.rcp.message, hpe.rcp.batch_size) == ("fail", "RCP Interpolation", 218)
    assert hpe.rcp.reference == "openfold_interp_218"
    assert hpe.rcp.submission_mean is not None and hpe.rcp.min_epochs is not None
    assert hpe.rcp.submission_mean < hpe.rcp.min_epochs
    (finding,) = [f for f in hpe.findings if f.rule == "rcp"]
    assert finding.severity == "warning"
    assert (
        "rcp-bypass" in finding.fix and "organisation-level package_checker_params is ignored" in finding.fix
    )


@pytest.mark.parametrize(("folder", "ruleset"), list(OFFICIAL))
def test_rcp_decision_is_the_official_one(
    folder: Path, ruleset: str, tmp_path: Path, quiet_official: None
) -> None:
    """Our in-memory decision against the official check_directory on a scratch copy."""
    from mlperf_logging.rcp_checker import rcp_checker

    reads = [parse_log(p).rcp for p in sorted(folder.glob("result_*.txt"))]
    ours = check_rcp(reads, ruleset)
    copy = tmp_path / "entry"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("scaling.json"))
    passed, message, _ = rcp_checker.check_directory(
        str(copy), "hpc", ruleset, False, False, rcp_pass="pruned_rcps", set_scaling=True
    )
    assert (ours.verdict == "pass", ours.message) == (passed, message)
    written = copy / "scaling.json"
    expected = rcp_checker.json.loads(written.read_text())["scaling_factor"] if written.exists() else 1.0
    assert ours.scaling_factor == expected == OFFICIAL[(folder, ruleset)][1]


@pytest.mark.parametrize("folder", [NCSA_OC20, HOREKA_COSMOFLOW, CLEMSON, HPE])
def test_rcp_reader_reads_what_the_official_reader_reads(folder: Path, quiet_official: None) -> None:
    from mlperf_logging.rcp_checker.rcp_checker import read_submission_file

    for path in sorted(folder.glob("result_*.txt")):
        not_converged, epochs, bs, benchmark = read_submission_file(str(path), "3.0.0", False)
        read = parse_log(path).rcp
        assert (not read.converged, read.epochs, read.batch_size, read.benchmark) == (
            not_converged,
            epochs,
            bs,
            benchmark,
        )


# --- bypass and scaling.json ------------------------------------------------------------


@pytest.fixture
def failing_entry(tmp_path: Path) -> Path:
    """An organisation holding only the horeka cosmoflow entry, which fails the RCP test."""
    org = tmp_path / "HelmholtzAI"
    shutil.copytree(HOREKA_COSMOFLOW, org / "results" / "sysA" / "strong" / "cosmoflow")
    (org / "systems").mkdir()
    shutil.copyfile(V2 / "systems" / "horeka_gpu_n512_pytorch1.13.json", org / "systems" / "sysA.json")
    return org / "results" / "sysA" / "strong" / "cosmoflow"


@pytest.mark.parametrize(
    ("where", "content", "verdict"),
    [
        ("entry", "rcp-bypass", "bypassed"),
        ("system", "rcp-bypass", "bypassed"),
        ("entry", "rcp-bypass\n", "fail"),  # the official code compares whole lines, newline included
        ("entry", "rcp_bypass", "fail"),
        ("org", "rcp-bypass", "fail"),  # the official code never reads the organisation's folder
    ],
)
def test_rcp_bypass_file(failing_entry: Path, where: str, content: str, verdict: str) -> None:
    folder = {"entry": failing_entry, "system": failing_entry.parents[1], "org": failing_entry.parents[4]}[
        where
    ]
    (folder / "package_checker_params").write_text(content)
    entry = check_submission(failing_entry.parents[4], ruleset="2.0.0").entries[0]
    assert entry.rcp is not None and entry.rcp.verdict == verdict
    (finding,) = [f for f in entry.findings if f.rule == "rcp"]
    assert finding.severity == "warning"


def test_a_stale_scaling_json_is_reported_and_not_used(tmp_path: Path) -> None:
    org = tmp_path / "HelmholtzAI"
    shutil.copytree(V2, org)
    oc20 = org / "results" / "juwelsbooster_gpu_n512_pytorch1.13" / "strong" / "oc20"
    (oc20 / "scaling.json").write_text('{"scaling_factor": 2.0}')
    entry = check_submission(org, ruleset="2.0.0").entry(
        "juwelsbooster_gpu_n512_pytorch1.13", "strong", "oc20"
    )
    assert entry.rcp_scaling_factor == OFFICIAL[(JUWELS_OC20, "2.0.0")][1]
    (finding,) = [f for f in entry.findings if f.rule == "scaling-json"]
    assert "says 2.0" in finding.message and finding.path.endswith("oc20/scaling.json")


def test_open_division_takes_no_rcp_check_but_reads_scaling_json(tmp_path: Path) -> None:
    org = tmp_path / "NCSA"
    shutil.copytree(V1, org)
    system = org / "systems" / "halv100_n16_pt1.7.1.json"
    system.write_text(system.read_text().replace('"closed"', '"open"'))
    oc20 = org / "results" / "halv100_n16_pt1.7.1" / "strong" / "oc20"
    (oc20 / "scaling.json").write_text('{"scaling_factor": 1.5}')
    (entry,) = check_submission(org).entries
    assert (entry.division, entry.rcp, entry.rcp_scaling_factor) == ("open", None, 1.5)
    (oc20 / "scaling.json").write_text('{"scaling_factor": "x"}')
    (entry,) = check_submission(org).entries
    assert entry.rcp_scaling_factor == 1.0
    # The published logs disagree with the system description (placeholders, other sizes).
    assert [f.rule for f in entry.findings if f.rule != "log-vs-system"] == ["scaling-json"]


# --- the decision on crafted reads ------------------------------------------------------


def reads(epochs: list[float], bs: object = 512, benchmark: object = "cosmoflow") -> list[RcpRead]:
    return [RcpRead(e < 1e9, e, bs, benchmark) for e in epochs]


def test_rcp_found_pass_fail_and_factor() -> None:
    # cosmoflow_ref_512 (2.0.0): RCP mean 22.8333, least acceptable mean 22.1995.
    slow = check_rcp(reads([25.0] * 10), "2.0.0")
    assert (slow.verdict, slow.message, slow.scaling_factor) == ("pass", "RCP found", 1.0)
    fast = check_rcp(reads([22.5] * 10), "2.0.0")
    assert fast.verdict == "pass"
    assert fast.scaling_factor == pytest.approx(fast.rcp_mean / 22.5)
    too_fast = check_rcp(reads([20.0] * 10), "2.0.0")
    assert (too_fast.verdict, too_fast.scaling_factor) == ("fail", 1.0)


def test_rcp_olympic_mean_drops_one_run_each_side() -> None:
    result = check_rcp(reads([1.0, 25.0, 25.0, 25.0, 25.0, 25.0, 25.0, 25.0, 25.0, 1e9]), "2.0.0")
    assert (result.verdict, result.submission_mean) == ("pass", 25.0)


@pytest.mark.parametrize(
    ("crafted", "verdict", "message"),
    [
        (reads([25.0] * 8 + [1e9, 1e9]), "fail", "Insufficient convergence"),
        (reads([25.0] * 10, bs=-1), "fail", "Could not detect global_batch_size"),
        (reads([25.0] * 10, bs=4096), "fail", "Missing RCP, please submit RCP with BS = 4096"),
        (reads([99.0] * 10, bs=16), "pass", "RCP not found but slower convergence on smaller batch size"),
        (reads([1.0] * 10, bs=16), "fail", "Missing RCP, please submit RCP with BS = 16"),
        (reads([25.0] * 10, benchmark="resnet"), "error", None),
        (reads([25.0] * 10, bs="512"), "error", None),
        (reads([25.0] * 9) + reads([25.0], bs=256), "error", None),
        (
            [*reads([25.0] * 9), RcpRead(False, 1e9, 512, "cosmoflow", "line 3: KeyError: 'status'")],
            "error",
            None,
        ),
    ],
)
def test_rcp_decision_on_crafted_runs(crafted: list[RcpRead], verdict: str, message: str | None) -> None:
    result = check_rcp(crafted, "2.0.0")
    assert result.verdict == verdict
    if message is not None:
        assert result.message == message
    assert result.scaling_factor >= 1.0


def test_interpolated_reference_between_batch_sizes() -> None:
    result = check_rcp(reads([30.0] * 10, bs=256), "2.0.0")
    assert (result.verdict, result.message, result.reference) == (
        "pass",
        "RCP Interpolation",
        "cosmoflow_interp_256",
    )
    assert (
        result.rcp_mean is not None and result.min_epochs is not None and result.min_epochs < result.rcp_mean
    )


# --- ruleset detection ------------------------------------------------------------------


def ms(day: str) -> float:
    return datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.timezone.utc).timestamp() * 1000


def ruleset_of_log(sniff: LogSniff) -> tuple[str, str] | None:
    """(earliest ruleset this log fits, why): the newest round among its signals; None if it has none."""
    found = log_signals(sniff)
    return max(found, key=lambda f: ruleset_key(f[0])) if found else None


@pytest.mark.parametrize(
    ("sniff", "expected"),
    [
        (LogSniff("deepcam", ms("2021-09-30"), False), "1.0.0"),
        (LogSniff("deepcam", ms("2021-11-20"), False), "2.0.0"),
        (LogSniff("deepcam", ms("2022-09-08"), False), "2.0.0"),
        (LogSniff("deepcam", ms("2023-09-08"), False), "3.0.0"),
        (LogSniff("openfold", ms("2021-09-30"), False), "3.0.0"),
        (LogSniff("deepcam", ms("2021-09-30"), True), "3.0.0"),
        (LogSniff(None, None, False), None),
    ],
)
def test_ruleset_of_one_log(sniff: LogSniff, expected: str | None) -> None:
    found = ruleset_of_log(sniff)
    assert (found and found[0]) == expected


def test_the_newest_log_decides_and_unknown_rulesets_are_ignored() -> None:
    old, new = LogSniff("deepcam", ms("2021-09-30"), False), LogSniff("deepcam", ms("2022-09-08"), False)
    assert detect_ruleset([old, new, old], ["1.0.0", "2.0.0", "3.0.0"], "3.0.0").ruleset == "2.0.0"
    assert detect_ruleset([new], ["1.0.0"], "1.0.0").reason == "no log tells its round; using 1.0.0"
    assert detect_ruleset([], ["3.0.0"], "3.0.0").ruleset == "3.0.0"


def test_ruleset_flag_overrides_detection() -> None:
    report = check_submission(V1, ruleset="2.0.0")
    assert (report.ruleset, report.ruleset_reason) == ("2.0.0", "--ruleset")
