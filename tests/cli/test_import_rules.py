"""The import rules: common/ is the bottom layer; staging, the checker and the catalog run without torch;
only `mlhpc stage-bench` imports the study, when it runs.

A login node has no torch: `mlhpc check`, `mlhpc stage` and the validation of a Slurm campaign
must work there. Static rules read the source (AST); runtime rules import in a fresh interpreter.
"""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Where common/ must never reach: the benchmarks (torch, and the catalog finds them through entry
# points) and the command line (which imports everything).
FORBIDDEN_IN_COMMON = ("mlhpc.benchmarks", "mlhpc.cli", "mlhpc.commands")
# Modules that are torch by design, imported only when chosen (the torch.distributed communicator).
TORCH_BY_DESIGN = {"mlhpc.staging.torch_comm"}
# The command line: nothing below it may import it back.
CLI = ("mlhpc.cli",)


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, relative ones resolved against `package`, and
    of every `importlib.import_module("literal")`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def imports_in(folder: Path, package: str) -> Iterator[tuple[Path, str, int, str]]:
    """(path under `folder`, the module's own dotted name, line, imported module) for every import
    in every .py file under `folder`, the modules of the `package` package."""
    for path in sorted(folder.rglob("*.py")):
        own = ".".join([package, *path.relative_to(folder).with_suffix("").parts])
        for line, module in imported_modules(path.read_text(encoding="utf-8"), own.rpartition(".")[0]):
            yield path.relative_to(folder), own, line, module


def forbidden(module: str) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in FORBIDDEN_IN_COMMON)


def test_the_static_rule_sees_each_kind_of_import() -> None:
    source = (
        "import mlhpc.benchmarks.cosmoflow\n"
        "from mlhpc.cli import main\n"
        "from .. import commands\n"
        "def f():\n    importlib.import_module('mlhpc.benchmarks')\n"
        "from mlhpc.common.contract import catalog\n"
        "from .errors import ConfigError\n"
    )
    found = imported_modules(source, "mlhpc.common")
    assert [line for line, module in found if forbidden(module)] == [1, 2, 3, 5]


def test_common_imports_neither_the_benchmarks_nor_the_cli() -> None:
    broken = [
        f"common/{path}:{line} imports {module}"
        for path, _, line, module in imports_in(REPO / "common", "mlhpc.common")
        if forbidden(module)
    ]
    assert not broken, broken


# The rooms of common/ and the rooms each may import (common/__init__.py draws them). The words at
# the top ("") import nothing of common/.
ROOM_ARROWS: dict[str, set[str]] = {
    "": set(),
    "safeio": {""},
    "cluster": {""},
    "contract": {"", "cluster"},
    "display": {"", "safeio", "cluster"},
    "training": {"", "safeio", "cluster", "contract", "display"},
}


def room_of(module: str) -> str | None:
    """The room of an `mlhpc.common...` module ("" for the words at the top), None outside."""
    parts = module.split(".")
    if parts[:2] != ["mlhpc", "common"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOM_ARROWS else ""


def arrows_broken(folder: Path) -> list[str]:
    """Each `file:line imports X` under the common/ `folder` that its room may not import."""
    broken = []
    for path, own, line, module in imports_in(folder, "mlhpc.common"):
        room, target = room_of(own), room_of(module)
        if module == "mlhpc.common" or target is None or target == room:
            continue
        if target not in ROOM_ARROWS[room]:
            broken.append(f"{path}:{line} ({room or 'top'}) imports {module}")
    return broken


def test_each_room_of_common_imports_only_the_rooms_below_it(tmp_path: Path) -> None:
    rooms = {p.name for p in (REPO / "common").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ROOM_ARROWS) - {""}, "a room not in ROOM_ARROWS: draw its arrows"
    for room in rooms:
        assert (REPO / "common" / room / "__init__.py").read_text().startswith('"""'), room
    assert arrows_broken(REPO / "common") == []
    # The rule sees an arrow upward and one from the words at the top.
    (tmp_path / "safeio").mkdir()
    (tmp_path / "safeio" / "bad.py").write_text("from mlhpc.common.training.loop import run\n")
    (tmp_path / "words.py").write_text("from mlhpc.common.contract import catalog\n")
    assert len(arrows_broken(tmp_path)) == 2


def test_the_commands_never_import_the_cli(tmp_path: Path) -> None:
    """cli.py imports every command; a command importing back (for Terminated, once) is a cycle that
    works only while the import order happens to allow it. What both need lives lower down."""
    assert imports_under(REPO / "mlhpc" / "commands", "mlhpc.commands", CLI) == []
    # The rule sees a lazy, relative one and an aliased one.
    (tmp_path / "bad.py").write_text("def f():\n    from .. import cli\n")
    (tmp_path / "worse.py").write_text("import mlhpc.cli as c\n")
    assert len(imports_under(tmp_path, "mlhpc.commands", CLI)) == 2


def test_every_command_module_is_listed_and_has_the_one_pattern() -> None:
    """Each module in mlhpc/commands/ is a subcommand in cli.COMMANDS with add_parser(sub, command)
    setting handler=_<name>: one place to look, none forgotten by `mlhpc --help`."""
    import inspect

    from mlhpc import cli

    folder = REPO / "mlhpc" / "commands"
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    assert {m.__name__.rsplit(".", 1)[1] for m in cli.COMMANDS} == modules
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for module in cli.COMMANDS:
        stem = module.__name__.rsplit(".", 1)[1]
        assert list(inspect.signature(module.add_parser).parameters) == ["sub", "command"], stem
        handler = sub.choices[stem.replace("_", "-")].get_default("handler")
        assert handler.__module__ == module.__name__ and handler.__name__ == f"_{stem}", stem


_IMPORT_EACH = """
import importlib, json, pkgutil, sys
exempt = set(json.loads(sys.argv[2]))
package = importlib.import_module(sys.argv[1])
names = [sys.argv[1]] + sorted(
    m.name for m in pkgutil.walk_packages(package.__path__, sys.argv[1] + ".") if m.name not in exempt
)
pulled = None
for name in names:
    importlib.import_module(name)
    if pulled is None and "torch" in sys.modules:
        pulled = name
print(json.dumps({"imported": names, "first_with_torch": pulled}))
"""


def import_each(package: str, exempt: set[str] = TORCH_BY_DESIGN) -> dict:
    """Import each module of `package` in turn in a fresh interpreter: which one brought torch in."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, package, json.dumps(sorted(exempt))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("package", ["mlhpc.staging", "mlhpc.study", "mlhpc.submission_checker"])
def test_login_node_packages_import_no_torch(package: str) -> None:
    result = import_each(package)
    assert len(result["imported"]) > 3, result
    assert result["first_with_torch"] is None, f"{result['first_with_torch']} imports torch"


# The two campaign modules that train or build a model; the rest plan and submit on a login node.
CAMPAIGN_TORCH_BY_DESIGN = {"mlhpc.campaign.local", "mlhpc.campaign.dry_run"}


def test_the_campaign_room_plans_and_submits_without_torch() -> None:
    """Planning, campaign.json, the options and the Slurm submitter: a login node has no torch."""
    result = import_each("mlhpc.campaign", CAMPAIGN_TORCH_BY_DESIGN)
    planning = {"plan", "prepare", "seeds", "settings", "io", "options", "slurm", "slurm_graph", "status"}
    assert {f"mlhpc.campaign.{name}" for name in planning} <= set(result["imported"])
    assert result["first_with_torch"] is None, f"{result['first_with_torch']} imports torch"


def imports_under(folder: Path, package: str, prefixes: tuple[str, ...]) -> list[str]:
    """Each `file:line imports X` under `folder` where X is one of `prefixes` or inside it."""
    return [
        f"{path}:{line} imports {module}"
        for path, _, line, module in imports_in(folder, package)
        if any(module == p or module.startswith(p + ".") for p in prefixes)
    ]


@pytest.mark.parametrize(
    ("room", "above"),
    [
        # The rooms serve the commands, never the other way round.
        ("campaign", ("mlhpc.cli", "mlhpc.commands", "mlhpc.results")),
        # What runs produced is read from their files, not from the code that ran them.
        ("results", ("mlhpc.cli", "mlhpc.commands", "mlhpc.campaign")),
        # The study measures staging: it needs no command, campaign or results store.
        ("study", ("mlhpc.cli", "mlhpc.commands", "mlhpc.campaign", "mlhpc.results")),
    ],
)
def test_the_top_floor_rooms_do_not_reach_up_or_across(room: str, above: tuple[str, ...]) -> None:
    folder = REPO / "mlhpc" / room
    assert len(list(folder.glob("*.py"))) > 3
    assert imports_under(folder, f"mlhpc.{room}", above) == []


# The study (`mlhpc stage-bench`, the model of staging time) sits beside the product: the one
# command that runs it imports it when it is the command, nothing else at all.
STUDY = ("mlhpc.study",)
STUDY_USER = "mlhpc.commands.stage_bench"
PRODUCT = {
    "mlhpc": "mlhpc",
    "common": "mlhpc.common",
    "staging": "mlhpc.staging",
    "submission_checker": "mlhpc.submission_checker",
    "benchmarks": "mlhpc.benchmarks",
}


def lines_in_functions(source: str) -> set[int]:
    """The lines of `source` that lie inside a function: an import there runs only when called."""
    return {
        line
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }


def study_importers(folder: Path, package: str) -> list[str]:
    """`module:line` for each import of the study under `folder` (the `package` package) but the
    study's own and the stage-bench command's inside a function."""
    broken = []
    for path, own, line, module in imports_in(folder, package):
        if own == STUDY[0] or own.startswith(f"{STUDY[0]}."):
            continue
        if not any(module == p or module.startswith(p + ".") for p in STUDY):
            continue
        if own == STUDY_USER and line in lines_in_functions((folder / path).read_text(encoding="utf-8")):
            continue
        broken.append(f"{own}:{line} imports {module}")
    return broken


def test_only_the_stage_bench_command_imports_the_study_and_only_when_run(tmp_path: Path) -> None:
    broken = [b for folder, package in PRODUCT.items() for b in study_importers(REPO / folder, package)]
    assert broken == []
    assert import_cycle(REPO / "mlhpc" / "study", "mlhpc.study") is None
    # The rule sees the command importing it at the top, and any other module importing it lazily.
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "stage_bench.py").write_text(
        "from mlhpc.study import bench\ndef f():\n    from ..study import model\n"
    )
    (tmp_path / "commands" / "stage.py").write_text("def f():\n    import mlhpc.study.raw\n")
    assert study_importers(tmp_path, "mlhpc") == [
        "mlhpc.commands.stage:2 imports mlhpc.study.raw",
        "mlhpc.commands.stage_bench:1 imports mlhpc.study.bench",
    ]


def import_cycle(folder: Path, package: str) -> list[str] | None:
    """A cycle among the modules under `folder` (imports at the top or inside functions alike),
    or None: one that only works because an import waits inside a function is still a circle."""
    modules = {
        ".".join([package, *p.relative_to(folder).with_suffix("").parts]) for p in folder.rglob("*.py")
    }
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for _, own, _, module in imports_in(folder, package):
        target = module if module in modules else module.rpartition(".")[0]
        if target in modules and target != own and not target.endswith(".__init__"):
            graph[own].add(target)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


@pytest.mark.parametrize("benchmark", ["aiperf", "cosmoflow", "deepcam", "extreme_weather"])
def test_no_benchmark_module_imports_back_into_one_that_imports_it(benchmark: str, tmp_path: Path) -> None:
    """The dali.py <-> data.py circles are cut: the loader choice lives in functions.py."""
    assert import_cycle(REPO / "benchmarks" / benchmark, f"mlhpc.benchmarks.{benchmark}") is None
    (tmp_path / "data.py").write_text("def build():\n    from mlhpc.x import dali\n")
    (tmp_path / "dali.py").write_text("from mlhpc.x.data import read\n")
    assert import_cycle(tmp_path, "mlhpc.x") is not None  # the rule sees a circle through a function


def test_the_torch_communicator_is_the_staging_module_exempt_by_name() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, mlhpc.staging.torch_comm; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.stdout.strip() == "True", proc.stderr  # else drop it from TORCH_BY_DESIGN


_CATALOG_USE = """
import json, sys
from mlhpc.common.contract import catalog, registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.contract.catalog import required_run_count
from mlhpc.submission_checker.compliance import own_rules
from mlhpc.submission_checker.layout_checks import known_benchmarks
seen = {}
for name in registry.names():
    facts = registry.info(name)
    for config in ("mini", "full"):
        cfg = load_config(facts.config_class, facts.config_path(config), [])
        seen[f"{name}/{config}"] = facts.division_for(cfg)
    seen[name] = [required_run_count(name), str(own_rules(name))]
seen["known"] = known_benchmarks("3.0.0")
seen["torch_without_get"] = "torch" in sys.modules
registry.get("cosmoflow")
seen["torch_after_get"] = "torch" in sys.modules
print(json.dumps(seen))
"""


def test_catalog_facts_and_configs_load_without_torch_until_get() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CATALOG_USE], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["torch_without_get"] is False
    assert seen["torch_after_get"] is True  # the detector works: get() binds the torch functions
    assert seen["deepcam/mini"] == "open" and seen["deepcam/full"] == "closed"
    assert seen["extreme_weather"][0] == 5 and seen["extreme_weather"][1].endswith(
        "closed_extreme_weather.yaml"
    )
    assert "extreme_weather" in seen["known"] and "cosmoflow" in seen["known"]


def test_every_package_folder_is_listed_for_installation() -> None:
    """A package missing from pyproject's list works in the editable checkout and is absent from
    a real install (`pip install .`, the container image): found here, not by a user."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {name: REPO / path for name, path in setuptools["package-dir"].items()}
    found = set()
    for name, root in folders.items():
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            if not any(p.startswith(".") or p in ("build", "tests", "perf", "docs") for p in parts):
                found.add(".".join((name, *parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


LOGIN_NODE = """
import sys
from mlhpc.cli import main
status = main(["run", sys.argv[1], "--slurm", "--dry-run", "--seeds", "2", "--first-seed", "9",
               "--out", sys.argv[2], *sys.argv[3:]])
print("torch imported" if "torch" in sys.modules else "no torch", status)
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["cosmoflow", "loop.max_epochs=7"], "no torch 0"),
        (["cosmoflow", "optimizer.lrr=1"], "no torch 2"),  # the typo found on the login node
        (["cosmoflw"], "no torch 2"),
    ],
)
def test_a_slurm_submission_validates_its_config_without_torch(
    tmp_path: Path, argv: list[str], expected: str
) -> None:
    """A login node may have no torch: `--slurm` loads and checks the config from the catalog."""
    proc = subprocess.run(
        [sys.executable, "-c", LOGIN_NODE, argv[0], str(tmp_path / "runs"), *argv[1:]],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == expected, proc.stdout[-2000:] + proc.stderr[-2000:]


_TEST_MODULE = re.compile(r"^(tests\.(?:\w+\.)*test_\w+)")


def imports_between_tests(folder: Path, package: str = "tests") -> list[str]:
    """`file:line module` for each import, under `folder` (the `package` folder), of another test
    module or of the conftest: helpers live in tests/helpers (a module may import itself, so that
    spawned processes unpickle what it defines)."""
    broken = []
    for path, own, line, module in imports_in(folder, package):
        other = _TEST_MODULE.match(module)
        conftest = module == f"{package}.conftest" or module.startswith(f"{package}.conftest.")
        if conftest or (other and other.group(1) != own):
            broken.append(f"{path}:{line} {module}")
    return broken


def test_no_test_module_imports_another_or_the_conftest(tmp_path: Path) -> None:
    assert imports_between_tests(REPO / "tests") == []
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "test_own.py").write_text("from tests.room.test_own import Picklable\n")
    (tmp_path / "helpers.py").write_text("from tests.helpers.cli import cli_env\n")
    assert imports_between_tests(tmp_path) == []  # itself, and a helper: both allowed
    (tmp_path / "room" / "test_a.py").write_text("from tests.other.test_b import helper\n")
    (tmp_path / "room" / "test_c.py").write_text("def f():\n    from tests.conftest import cli_env\n")
    (tmp_path / "room" / "test_d.py").write_text("from tests.other import test_b\nimport tests.conftest\n")
    (tmp_path / "room" / "test_e.py").write_text("from ..other.test_b import helper\n")
    assert len(imports_between_tests(tmp_path)) == 5
