"""`mlhpc stage` starts lean: it imports neither the Slurm campaign nor the benchmark tools
(their options are added only when `run` or `stage-bench` is the command), and they still are.
The --help of stage, manifest and verify imports no staging module at all (perf/start_time.py
measures the start; here, what is imported, so a fast start cannot silently go)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.cli import build_parser
from mlhpc.common import vocabulary
from tests.helpers.cli import cli_env

PROBE = """
import sys
from mlhpc.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("mlhpc.campaign.slurm", "mlhpc.study", "torch") if m in sys.modules)
print("imported:", ",".join(heavy) or "-")
raise SystemExit(code)
"""


def test_mlhpc_stage_imports_neither_slurm_nor_the_bench_tools(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 1000)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "stage", str(src), str(tmp_path / "dest")],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "imported: -" in done.stdout and (tmp_path / "dest" / "a.bin").read_bytes() == b"x" * 1000


def test_run_and_stage_bench_keep_their_options() -> None:
    full = build_parser()
    args = full.parse_args(["run", "cosmoflow", "--out", "o", "--slurm", "--slurm-nodes", "2"])
    assert args.slurm and args.slurm_nodes == 2
    assert build_parser("run").parse_args(["run", "cosmoflow", "--out", "o", "--slurm"]).slurm
    bench = build_parser("stage-bench").parse_args(["stage-bench", "--out", "o"])
    assert bench.handler.__name__ == "_stage_bench" and hasattr(bench, "total_mib")


# What a staging command's --help may import of mlhpc: the command line, its commands and the words
# they build options from. STAGING_AT_HELP: the staging modules it may import, none (the choices and
# defaults come from mlhpc.common.vocabulary); a module named here is a decision, not a drift.
STAGING_AT_HELP: frozenset[str] = frozenset()
MLHPC_AT_HELP = {
    "mlhpc",
    "mlhpc.cli",
    "mlhpc.common",
    "mlhpc.common.cluster",
    "mlhpc.common.cluster.spin",
    "mlhpc.common.errors",
    "mlhpc.common.printable",
    "mlhpc.common.vocabulary",
}
# What --help imports beyond argparse printing its own help: typing (the vocabulary's Literals),
# unicodedata (printable). The baseline interpreter imports these too, so anything more shows.
BASELINE = """
import argparse, collections.abc, sys, typing, unicodedata
parser = argparse.ArgumentParser()
parser.add_argument("x")
try:
    parser.parse_args(["--help"])
except SystemExit:
    pass
modules = sorted(sys.modules)
import json
with open(sys.argv[1], "w") as out:
    json.dump(modules, out)
"""
HELP = """
import sys
from mlhpc.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
modules = sorted(sys.modules)
import json
with open(sys.argv[1], "w") as out:
    json.dump(modules, out)
"""


def modules_after(probe: str, argv: list[str], tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds after `probe` ran with `argv` (its stdout dropped)."""
    where = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", probe, str(where), *argv],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(where.read_text()))


@pytest.mark.parametrize("command", ["stage", "manifest", "verify"])
def test_a_staging_command_s_help_imports_no_staging_module(command: str, tmp_path: Path) -> None:
    modules = modules_after(HELP, [command, "--help"], tmp_path)
    staging = {m for m in modules if m == "mlhpc.staging" or m.startswith("mlhpc.staging.")}
    assert staging == STAGING_AT_HELP, (
        f"mlhpc {command} --help imports {sorted(staging)}: take the parser's words from "
        "mlhpc.common.vocabulary, or import inside the handler"
    )
    ours = {m for m in modules if m.startswith("mlhpc.") or m == "mlhpc"}
    commands = {m for m in ours if m.startswith("mlhpc.commands")}
    assert f"mlhpc.commands.{command}" in commands
    assert ours - commands == MLHPC_AT_HELP  # no logging set-up, no signals, no campaign, no threads
    baseline = modules_after(BASELINE, [], tmp_path)
    more = sorted(m for m in modules - baseline if m not in ours)
    assert more == [], f"mlhpc {command} --help imports {more}: import them where they are used"


def test_the_command_line_s_staging_words_are_staging_s() -> None:
    """The parser takes --mode's choices and the --workers default from the vocabulary, so that
    --help imports no staging; they must stay what staging itself takes."""
    from mlhpc.staging import MODES, StageRequest

    assert vocabulary.STAGING_MODES == MODES
    assert inspect.signature(StageRequest).parameters["workers"].default == vocabulary.STAGING_WORKERS
    for command in ("stage", "manifest"):
        args = build_parser(command).parse_args([command, "x", *(["y"] if command == "stage" else [])])
        assert args.workers == vocabulary.STAGING_WORKERS
