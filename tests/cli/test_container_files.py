"""The container recipes (mlhpc.def's %files, the Dockerfile's COPY and .dockerignore) bring
every folder and file that pyproject.toml installs: pure file reading, no container runtime."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

# tomllib is 3.11+; mlhpc supports 3.10, where this file-reading check is skipped.
tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def installed_sources(pyproject: dict) -> set[str]:
    """The repo-root folders and files that `pip install /src` reads, from pyproject.toml."""
    setup = pyproject["tool"]["setuptools"]
    dirs = setup.get("package-dir", {})
    needed = {"pyproject.toml"}
    for package in setup["packages"]:
        parts = package.split(".")
        # The longest package-dir prefix decides where the package's folder lies.
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in dirs:
                folder = Path(dirs[prefix], *parts[cut:])
                break
        else:
            folder = Path(*parts)
        needed.add(folder.parts[0])
    readme = pyproject["project"].get("readme")
    if isinstance(readme, str):
        needed.add(readme)
    return needed


def def_files_sources(text: str) -> set[str]:
    """The host-side sources of a definition's %files section (first word of each line)."""
    match = re.search(r"^%files[^\n]*\n(.*?)(?=^%|\Z)", text, re.M | re.S)
    assert match, "mlhpc.def has no %files section"
    sources = set()
    for line in match.group(1).splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            sources.add(words[0].rstrip("/"))
    return sources


def missing_from_def(needed: set[str], sources: set[str]) -> set[str]:
    """What the image would lack: a needed path that no %files source is or contains."""
    return {n for n in needed if not any(n == s or n.startswith(s + "/") for s in sources)}


def test_def_files_cover_every_installed_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = installed_sources(pyproject)
    assert {"mlhpc", "common", "staging", "benchmarks", "submission_checker"} <= needed
    for path in needed:
        assert (ROOT / path).exists(), f"pyproject.toml installs {path}, which the repo lacks"
    missing = missing_from_def(needed, def_files_sources((ROOT / "mlhpc.def").read_text()))
    assert not missing, f"mlhpc.def's %files lacks {sorted(missing)}: pip install /src would fail"


def test_a_folder_dropped_from_def_files_is_caught() -> None:
    """The check above can fail: drop one package folder from %files and it is named."""
    text = (ROOT / "mlhpc.def").read_text()
    crippled = re.sub(r"^\s*staging /src/\n", "", text, flags=re.M)
    assert crippled != text, "mlhpc.def no longer has a 'staging /src/' line to drop"
    needed = installed_sources(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert missing_from_def(needed, def_files_sources(crippled)) == {"staging"}


def test_a_package_under_an_unmapped_folder_is_needed() -> None:
    pyproject = {"project": {}, "tool": {"setuptools": {"packages": ["mlhpc", "mlhpc.extra"],
                                                          "package-dir": {"mlhpc.extra": "extra"}}}}
    assert installed_sources(pyproject) == {"pyproject.toml", "mlhpc", "extra"}


def dockerignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns)


@pytest.mark.parametrize("recipe", ["Dockerfile"])
def test_dockerfile_copies_every_installed_package(recipe: str) -> None:
    text = (ROOT / recipe).read_text()
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith(("COPY ", "ADD "))]
    sources = {s.rstrip("/") for words in copies for s in words if not s.startswith("--")}
    needed = installed_sources(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    if "." not in sources:
        missing = missing_from_def(needed, sources)
        assert not missing, f"{recipe}'s COPY lines lack {sorted(missing)}"
    ignore = ROOT / ".dockerignore"
    patterns = [p.strip() for p in ignore.read_text().splitlines() if p.strip() and not p.startswith("#")]
    hidden = {n for n in needed if dockerignored(n, patterns)}
    assert not hidden, f".dockerignore hides {sorted(hidden)} from {recipe}'s COPY"
    assert dockerignored("staging", [*patterns, "staging"]), "the .dockerignore check cannot fail"
