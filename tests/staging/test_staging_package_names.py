"""`mlhpc.staging` imports its public names on first use: every name in `__all__` still imports
from the package, as the object its module defines, and importing the package alone loads no
submodule (`mlhpc verify` then loads the verifier, not the whole engine)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mlhpc.staging as staging
from tests.helpers.cli import cli_env

PROBE = """
import json, sys
import mlhpc.staging
alone = sorted(m for m in sys.modules if m.startswith("mlhpc.staging."))
from mlhpc.staging import *
print(json.dumps({"alone": alone, "star": sorted(k for k in dir() if not k.startswith("_"))}))
"""


def test_every_public_name_has_its_module_and_comes_from_it() -> None:
    assert sorted(staging._HOME) == sorted(staging.__all__)
    for name, home in staging._HOME.items():
        module = importlib.import_module(f"mlhpc.staging.{home}")
        assert getattr(staging, name) is getattr(module, name), name
    assert set(staging.__all__) <= set(dir(staging))
    # The imports type checkers read (under TYPE_CHECKING) say the same.
    tree = ast.parse(Path(staging.__file__).read_text(encoding="utf-8"))
    typed = {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlhpc.staging.")
        for alias in node.names
    }
    assert typed == {name: f"mlhpc.staging.{home}" for name, home in staging._HOME.items()}


def test_the_package_alone_loads_no_submodule_and_star_gives_every_name() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=cli_env(), check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["alone"] == []
    assert set(staging.__all__) <= set(seen["star"])


def test_an_unknown_name_is_an_attribute_error_and_a_submodule_still_imports() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        staging.no_such_name  # noqa: B018
    from mlhpc.staging import archive  # a submodule, found because __getattr__ says no

    assert archive.__name__ == "mlhpc.staging.archive"
