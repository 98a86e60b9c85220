"""`mlhpc stage` starts lean: it imports neither the Slurm campaign nor the benchmark tools
(their options are added only when `run` or `stage-bench` is the command), and they still are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlhpc.cli import build_parser
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
