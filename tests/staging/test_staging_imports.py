"""Staging's module graph: no import cycle (lazy imports inside functions count too), nothing of
the study (mlhpc/study/) imported, and every module but the torch communicator imports without
torch, so staging runs on a login node."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env

STAGING = Path(__file__).resolve().parents[2] / "staging"
PACKAGE = "mlhpc.staging"
NEEDS_TORCH = {"mlhpc.staging.torch_comm"}


def module_name(path: Path) -> str:
    parts = path.relative_to(STAGING).with_suffix("").parts
    return ".".join((PACKAGE, *parts)).removesuffix(".__init__")


MODULES = {module_name(p): p for p in sorted(STAGING.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """The staging modules `path` imports anywhere in it; `from package import module` is the module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return {name for name in found if name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its modules in order (first repeated last), or None."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        trail.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                return [*trail[trail.index(other) :], other]
            if other not in state and (cycle := visit(other)) is not None:
                return cycle
        state[name] = "done"
        trail.pop()
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)) is not None:
            return cycle
    return None


def test_the_cycle_finder_sees_lazy_imports_and_circles(tmp_path: Path) -> None:
    lazy = tmp_path / "lazy.py"
    lazy.write_text(
        "def f():\n    from mlhpc.staging import parallel\n    from mlhpc.staging.engine import Partial\n"
    )
    assert imports_of(lazy) == {"mlhpc.staging.parallel", "mlhpc.staging.engine"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_staging_has_no_import_cycle() -> None:
    graph = {name: imports_of(path) - {name} for name, path in MODULES.items()}
    assert graph["mlhpc.staging.parallel"] >= {"mlhpc.staging.engine", "mlhpc.staging.journal"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


STUDY = "mlhpc.study"


def study_imports(path: Path, package: str) -> list[str]:
    """The modules of the study (`mlhpc.study`) that `path`, a module of `package`, imports
    anywhere in it, relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [name for name in names if name == STUDY or name.startswith(f"{STUDY}.")]
    return found


def test_staging_imports_nothing_of_the_study(tmp_path: Path) -> None:
    """The study (mlhpc/study/: `mlhpc stage-bench` and the model) measures staging from outside:
    nothing staging does imports it, at the top or inside a function."""
    package = {
        name: name if path.name == "__init__.py" else name.rpartition(".")[0]
        for name, path in MODULES.items()
    }
    leaks = {name: study_imports(path, package[name]) for name, path in MODULES.items()}
    assert not {name: found for name, found in leaks.items() if found}
    # The rule sees a lazy import and a relative one.
    (tmp_path / "bad.py").write_text("def f():\n    from mlhpc.study import model\nfrom ..study import raw\n")
    assert sorted(study_imports(tmp_path / "bad.py", PACKAGE)) == ["mlhpc.study.model", "mlhpc.study.raw"]


@pytest.mark.parametrize("name", sorted(set(MODULES) - NEEDS_TORCH))
def test_each_staging_module_imports_without_torch(name: str) -> None:
    probe = f"import sys, {name}; sys.exit('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{name} imports torch{done.stderr}"


def test_the_package_leaves_the_worker_module_to_its_processes() -> None:
    """`python -m mlhpc.staging.parallel` must not find itself imported by the package (runpy warns)."""
    probe = "import sys, mlhpc.staging; sys.exit('mlhpc.staging.parallel' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], env=cli_env(), check=False).returncode == 0
