"""The benchmark catalog and registry: entry points in, facts without torch, functions bound by get().

Third-party benchmarks are real installed distributions: a `<name>-<version>.dist-info` folder
with an entry_points.txt and a package beside it, on the PYTHONPATH of a fresh interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from mlhpc.benchmarks import BUILTIN
from mlhpc.common.contract import catalog, registry
from mlhpc.common.contract.catalog import required_run_count
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import cli_env, mlhpc_cli
from tests.helpers.toy_benchmark import TOY, TOY_INFO

REPO = Path(__file__).resolve().parents[2]

THIRD_INIT = """
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.contract.catalog import BenchmarkInfo, Target
from mlhpc.common.training.loop_config import LoopConfig


@dataclass(kw_only=True, frozen=True)
class ThirdConfig:
    loop: LoopConfig
    width: int = 4


BENCHMARK = BenchmarkInfo(
    name="thirdbench",
    config_class=ThirdConfig,
    configs_dir=Path(__file__).parent / "configs",
    target=Target(metric="eval_error", direction="min"),
    strong_run_count=3,
    functions="thirdbench.functions:FUNCTIONS",
)
"""

THIRD_FUNCTIONS = """
from pathlib import Path

from mlhpc.common.contract.registry import BenchmarkFunctions


def generate(cfg, out_dir, num_samples=None, seed=0):
    Path(out_dir, "samples.txt").write_text(f"width={cfg.width} seed={seed}\\n")


def not_here(*args, **kwargs):
    raise NotImplementedError


FUNCTIONS = BenchmarkFunctions(
    generate=generate,
    validate_dataset=not_here,
    build_model=not_here,
    build_data=not_here,
    build_optimizer=not_here,
    compute_loss=not_here,
    evaluate=not_here,
    hyperparameters=not_here,
)
"""

THIRD_MINI = "width: 7\nloop:\n  global_batch_size: 2\n  max_epochs: 1\n  target: 0.5\n"

# A second distribution that declares a benchmark under a name mlhpc already ships.
DUPLICATE_INIT = THIRD_INIT.replace('name="thirdbench"', 'name="cosmoflow"')


def install(root: Path, dist: str, version: str, declared: dict[str, str], files: dict[str, str]) -> None:
    """Install distribution `dist` into `root` as pip would lay it out: its files and a dist-info
    folder whose entry_points.txt declares `declared` in the mlhpc.benchmarks group."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    meta = root / f"{dist}-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in declared.items())
    (meta / "entry_points.txt").write_text(f"[{catalog.GROUP}]\n{lines}")


def install_thirdbench(root: Path) -> None:
    files = {
        "thirdbench/__init__.py": THIRD_INIT,
        "thirdbench/functions.py": THIRD_FUNCTIONS,
        "thirdbench/configs/mini.yaml": THIRD_MINI,
    }
    install(root, "thirdbench", "1.0", {"thirdbench": "thirdbench:BENCHMARK"}, files)


def python(code: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that sees the distributions installed under `site`."""
    env = cli_env(PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


# --- the built-ins --------------------------------------------------------------------------------


def test_pyproject_entry_points_are_the_builtin_list() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][catalog.GROUP]
    assert declared == {name: f"mlhpc.benchmarks.{name}:BENCHMARK" for name in BUILTIN}


def test_installed_metadata_declares_the_builtins() -> None:
    """Fails on an install made before the entry points changed: reinstall (pip install -e .)."""
    ours = {ep.name for ep in entry_points(group=catalog.GROUP) if ep.dist and ep.dist.name == "mlhpc"}
    assert ours == set(BUILTIN)
    assert set(BUILTIN) <= set(registry.names())


@pytest.mark.parametrize("name", BUILTIN)
def test_each_builtin_binds_its_functions_and_loads_its_configs(name: str) -> None:
    facts = registry.info(name)
    assert facts.name == name
    bench = registry.get(name)
    assert bench.info is facts and registry.get(name) is bench
    assert (bench.name, bench.config_class, bench.target) == (name, facts.config_class, facts.target)
    for config in ("mini", "full"):
        cfg = load_config(bench.config_class, bench.config_path(config), [])
        assert facts.division_for(cfg) in ("closed", "open")


def test_deepcam_mini_goes_in_open_and_the_others_in_closed() -> None:
    for name, division in (("deepcam", "open"), ("cosmoflow", "closed"), ("extreme_weather", "closed")):
        facts = registry.info(name)
        cfg = load_config(facts.config_class, facts.config_path("mini"), [])
        assert facts.division_for(cfg) == division


def test_run_counts_of_official_benchmarks_agree_with_mlperf_logging() -> None:
    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    official = _ALL_RESULT_FILE_COUNTS["hpc"]
    for name in registry.names():
        facts = registry.info(name)
        assert required_run_count(name) == facts.strong_run_count
        if name in official or facts.workload == "automl":  # AIPerf logs no MLLOG: no rules
            assert facts.rules_file is None, f"{name}: mlperf_logging has its rules"
        else:
            assert facts.rules_file is not None and facts.rules_file.is_file(), name


def test_unknown_benchmark_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="no benchmark 'cosmo'; known: aiperf, cosmoflow, deepcam, extreme_weather"):
        registry.info("cosmo")


@given(st.text(max_size=40))
def test_names_read_from_a_submission_never_raise(name: str) -> None:
    found = catalog.find(name)
    assert found is None or found.name == name
    count = required_run_count(name)
    assert count is None or (count >= 1 and (found is not None or name in {"oc20", "openfold"}))


# --- discovery: one line for each bad declaration, the rest still usable -------------------------


@functools.cache
def _builtin_points() -> tuple[EntryPoint, ...]:
    return tuple(ep for ep in entry_points(group=catalog.GROUP) if ep.name in BUILTIN)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("nothing", "_mlhpc_no_such_module:X", "failed to load (ModuleNotFoundError: No module named"),
        ("wrong_kind", "mlhpc.common.contract.catalog:Target", "is a type, not a BenchmarkInfo"),
        ("renamed", "mlhpc.benchmarks.cosmoflow:BENCHMARK", "holds benchmark 'cosmoflow'"),
        ("bad value", "not a reference", "failed to load"),
    ],
)
def test_a_bad_entry_point_is_refused_alone(name: str, value: str, says: str) -> None:
    found = catalog.discover([*_builtin_points(), EntryPoint(name, value, catalog.GROUP)])
    assert found.names() == sorted(BUILTIN)
    with pytest.raises(ConfigError) as refused:
        found.info(name)
    assert says in str(refused.value) and f"'{name} = {value}'" in str(refused.value)
    assert "\n" not in str(refused.value)


@given(name=st.text(min_size=1, max_size=20), value=st.text(max_size=60))
def test_hostile_entry_points_never_stop_discovery(name: str, value: str) -> None:
    # Prefixed so that no text names a real module: importing one could have side effects.
    point = EntryPoint(name, "_mlhpc_absent_" + value, catalog.GROUP)
    found = catalog.discover([*_builtin_points(), point])
    assert set(found.names()) == set(BUILTIN) - {name}
    if name not in BUILTIN:
        assert "\n" not in found.refused[name]
    else:
        assert "declared twice" in found.refused[name]


def test_a_catalog_without_mlhpcs_own_entry_points_says_to_reinstall() -> None:
    others = [EntryPoint("renamed", "mlhpc.benchmarks.cosmoflow:BENCHMARK", catalog.GROUP)]
    found = catalog.discover(others)
    assert not found.has_builtins
    for ask in (found.names, lambda: found.info("cosmoflow")):
        with pytest.raises(ConfigError, match=r"mlhpc's own benchmarks are not registered; reinstall mlhpc"):
            ask()


def test_benchmark_info_refuses_bad_facts() -> None:
    good = {
        "name": "x",
        "config_class": dict,
        "configs_dir": Path("."),
        "target": TOY_INFO.target,
        "strong_run_count": 1,
        "functions": "pkg.mod:OBJ",
    }
    catalog.BenchmarkInfo(**good)
    for field, value in (("name", "Bad Name"), ("functions", "pkg.mod"), ("strong_run_count", 0)):
        with pytest.raises(ConfigError, match=field):
            catalog.BenchmarkInfo(**{**good, field: value})


# --- third-party distributions, installed for real, in fresh interpreters ------------------------


def test_third_party_benchmark_joins_the_catalog_and_the_cli(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_thirdbench(site)
    code = """
import json, sys
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.contract.catalog import required_run_count
facts = registry.info("thirdbench")
cfg = load_config(facts.config_class, facts.config_path("mini"), ["width=9"])
torch_before_get = "torch" in sys.modules
bench = registry.get("thirdbench")
print(json.dumps([registry.names(), cfg.width, required_run_count("thirdbench"), torch_before_get,
                  bench.generate.__module__]))
"""
    proc = python(code, site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    names, width, runs, torch_before_get, module = json.loads(proc.stdout)
    assert names == sorted([*BUILTIN, "thirdbench"])
    assert (width, runs, torch_before_get, module) == (9, 3, False, "thirdbench.functions")
    out = tmp_path / "data"
    generated = mlhpc_cli(["generate", "thirdbench", "--config", "mini", "--out", str(out)], tmp_path, timeout=300, PYTHONPATH=str(site))
    assert generated.returncode == 0, generated.stderr
    assert (out / "samples.txt").read_text() == "width=7 seed=0\n"


_CHECK_THIRDBENCH = """
import json, sys
from pathlib import Path
from mlhpc.submission_checker.compliance import analyse_log
from mlhpc.submission_checker.layout_checks import known_benchmarks
from tests.helpers.mllog_files import _good_events, _write_log
events = [(k, key, "thirdbench" if key == "submission_benchmark" else v, m) for k, key, v, m in _good_events()]
log = str(_write_log(Path(sys.argv[1]), events))
checked = analyse_log(log, "3.0.0")
print(json.dumps(["thirdbench" in known_benchmarks("3.0.0"), checked.compliant,
                  [m.text for m in checked.messages]]))
"""


def test_the_checker_runs_a_third_party_benchmark_under_its_rules_file(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_thirdbench(site)
    ours = (REPO / "benchmarks" / "extreme_weather" / "closed_extreme_weather.yaml").read_text()
    rules = site / "thirdbench" / "rules.yaml"
    rules.write_text(ours.replace("== 'extreme_weather'", "== 'thirdbench'"))
    init = site / "thirdbench" / "__init__.py"
    init.write_text(
        init.read_text().replace(
            "strong_run_count=3,", "strong_run_count=3, rules_file=Path(__file__).parent / 'rules.yaml',"
        )
    )
    env = cli_env(PYTHONPATH=f"{site}{os.pathsep}{REPO}")
    check = [sys.executable, "-c", _CHECK_THIRDBENCH, str(tmp_path / "result_0.txt")]
    proc = subprocess.run(check, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [True, True, []]
    rules.unlink()
    proc = subprocess.run(check, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    known, compliant, messages = json.loads(proc.stdout)
    assert (known, compliant) == (True, False)
    assert messages == [f"the rule file {rules} of thirdbench is not installed; reinstall its package"]


def test_broken_third_party_entry_point_is_one_line_and_spares_the_rest(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "brokenbench", "2.0", {"brokenbench": "brokenbench:BENCHMARK"}, {})
    proc = python("from mlhpc.common.contract import registry; print(registry.names())", site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(BUILTIN))
    generated = mlhpc_cli(["generate", "brokenbench", "--out", str(tmp_path / "data")], tmp_path, timeout=300, PYTHONPATH=str(site))
    assert generated.returncode == 2
    errors = [line for line in generated.stderr.splitlines() if "brokenbench" in line]
    assert "Traceback" not in generated.stderr
    assert any(
        "entry point 'brokenbench = brokenbench:BENCHMARK' of brokenbench 2.0 failed to load "
        "(ModuleNotFoundError: No module named 'brokenbench')" in line
        for line in errors
    ), generated.stderr


def test_two_benchmarks_with_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(
        site, "dupbench", "0.3", {"cosmoflow": "dupbench:BENCHMARK"}, {"dupbench/__init__.py": DUPLICATE_INIT}
    )
    code = """
from mlhpc.common.contract import registry
from mlhpc.common.errors import ConfigError
print(registry.names())
try:
    registry.info("cosmoflow")
except ConfigError as e:
    print(e)
"""
    proc = python(code, site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed, refused = proc.stdout.splitlines()
    assert listed == str(["aiperf", "deepcam", "extreme_weather"])
    assert "benchmark 'cosmoflow' is declared twice" in refused
    assert "'cosmoflow = mlhpc.benchmarks.cosmoflow:BENCHMARK' of mlhpc" in refused
    assert "'cosmoflow = dupbench:BENCHMARK' of dupbench 0.3" in refused


def test_register_adds_to_this_process_and_refuses_a_known_name(tmp_path: Path) -> None:
    code = """
import dataclasses
from mlhpc.common.contract import registry
from mlhpc.common.errors import ConfigError
from tests.helpers.toy_benchmark import TOY
registry.register(TOY)
print(registry.get("toy") is TOY, "toy" in registry.names())
for again in (TOY, dataclasses.replace(TOY.info, name="cosmoflow")):
    try:
        registry.register(again)
    except ConfigError as e:
        print(e)
"""
    proc = python(code, REPO, tmp_path)
    assert proc.returncode == 0, proc.stderr
    bound, twice, known = proc.stdout.splitlines()
    assert bound == "True True"
    assert twice == (
        "benchmark 'toy' is declared twice: by register() in this process and by register() in this "
        "process; uninstall or rename one of them"
    )
    assert "benchmark 'cosmoflow' is declared twice: by entry point 'cosmoflow = " in known


def test_toy_is_bound_like_a_catalog_entry() -> None:
    assert registry.load_functions(TOY_INFO).build_model is TOY.build_model
    assert TOY.name == "toy" and TOY.info is TOY_INFO


def test_functions_that_cannot_load_are_one_line() -> None:
    import dataclasses

    missing = dataclasses.replace(TOY_INFO, functions="tests._no_such_module:FUNCTIONS")
    with pytest.raises(ConfigError, match=r"benchmark toy: cannot load tests._no_such_module:FUNCTIONS"):
        registry.load_functions(missing)
    wrong = dataclasses.replace(TOY_INFO, functions="tests.helpers.toy_benchmark:TOY_INFO")
    with pytest.raises(ConfigError, match="is a BenchmarkInfo, not a BenchmarkFunctions"):
        registry.load_functions(wrong)
