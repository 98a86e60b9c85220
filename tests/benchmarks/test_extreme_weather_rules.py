"""closed_extreme_weather.yaml through the official compliance checker, and its drift from mlperf_logging."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mlhpc.submission_checker.compliance import analyse_log, own_rules
from tests.helpers.mllog_files import RULES_FILE, _good_events, _write_log, official_compliance

# Keys whose rules this file changes on purpose (see its header): the two dispatches to other
# rule files and closed_common's optional gradient_accumulation_frequency, made required.
CHANGED = {"submission_division", "submission_benchmark", "gradient_accumulation_frequency"}






def test_official_checker_accepts_a_good_log_and_rejects_bad_ones(tmp_path: Path) -> None:
    good = _write_log(tmp_path / "good.txt", _good_events())
    no_eval = _write_log(tmp_path / "no_eval.txt", [e for e in _good_events() if e[1] != "eval_accuracy"])
    below = _write_log(tmp_path / "below.txt", _good_events(accuracy=(0.21, 0.349)))
    passed = official_compliance(good, rules=RULES_FILE)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    missing = official_compliance(no_eval, rules=RULES_FILE)
    assert missing.returncode == 1 and "Required AT_LEAST_ONE occurrence of 'eval_accuracy'" in missing.stderr
    low = official_compliance(below, rules=RULES_FILE)
    assert low.returncode == 1 and "Failed checks for eval_accuracy" in low.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda e: [x for x in e if x[1] != "opt_momentum"],
            "Required EXACTLY_ONE occurrence of 'opt_momentum'",
        ),
        (
            lambda e: [(*x[:2], "adam", x[3]) if x[1] == "opt_name" else x for x in e],
            "v['value'] in ['sgd', 'SGD']",
        ),
        (lambda e: [x for x in e if x[1] != "seed"], "Required EXACTLY_ONE occurrence of 'seed'"),
    ],
)
def test_our_checker_runs_the_rules_for_extreme_weather_logs(
    tmp_path: Path, change: Any, message: str
) -> None:
    good = analyse_log(str(_write_log(tmp_path / "good.txt", _good_events())), "3.0.0")
    assert good.compliant, good.messages
    assert good.log is not None and good.log.achieved_flops_per_s == pytest.approx(3.0e10)
    bad = analyse_log(str(_write_log(tmp_path / "bad.txt", change(_good_events()))), "3.0.0")
    assert not bad.compliant
    assert any(message in m.text for m in bad.messages), bad.messages


def test_rules_file_comes_from_the_catalog() -> None:
    assert own_rules("extreme_weather") == RULES_FILE.resolve()
    assert own_rules("cosmoflow") is None


def _keys(path: Path) -> dict[str, dict[str, Any]]:
    records = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    return {r["KEY"]["NAME"]: r["KEY"] for r in records if "KEY" in r}


def test_common_part_equals_the_installed_hpc_rules() -> None:
    import mlperf_logging.compliance_checker as cc

    folder = Path(cc.__file__).parent / "hpc_3.0.0"
    installed = {**_keys(folder / "common.yaml"), **_keys(folder / "closed_common.yaml")}
    ours = _keys(RULES_FILE)
    for name, rule in installed.items():
        assert name in ours, f"{name} of the installed HPC rules is missing"
        if name not in CHANGED:
            assert ours[name] == rule, f"{name} differs from the installed HPC rules"
    begin = [r for r in yaml.safe_load((folder / "common.yaml").read_text()) if "BEGIN" in r]
    assert [r for r in yaml.safe_load(RULES_FILE.read_text()) if "BEGIN" in r] == begin


def test_check_reports_the_mean_flops_of_compliant_runs() -> None:
    from mlhpc.submission_checker.command import flops_lines
    from mlhpc.submission_checker.report import CheckReport, EntryReport, RunReport

    runs = (
        RunReport("r0", 1.0, True, achieved_flops_per_s=2e10, valid_flops=4e10),
        RunReport("r1", 1.0, True, achieved_flops_per_s=4e10, valid_flops=6e10),
        RunReport("r2", 1.0, False, achieved_flops_per_s=9e10, valid_flops=9e10),  # not compliant
        RunReport("r3", 1.0, True),  # logged none
    )
    entry = EntryReport("org", "sys", "extreme_weather", "strong", runs, None, None, None, ())
    assert entry.mean_flops() == (3e10, 5e10, 2)
    assert runs[0].to_json()["valid_flops"] == 4e10 and "valid_flops" not in runs[3].to_json()
    lines = [t.plain for t in flops_lines(CheckReport("/x", "3.0.0", (entry,)))]
    assert lines == [
        "org/sys/strong/extreme_weather: achieved 3e+10 FLOP/s, Valid FLOPS 5e+10 "
        "(HPC AI500; mean of 2 compliant run(s))"
    ]
    no_flops = EntryReport("org", "sys", "cosmoflow", "strong", runs[3:], None, None, None, ())
    assert flops_lines(CheckReport("/x", "3.0.0", (no_flops,))) == []
