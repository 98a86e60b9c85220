"""`mlhpc stage-bench`: staging throughput against cp, tar and the raw disk (the study's tools)."""

from __future__ import annotations

import argparse

from mlhpc.commands import add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    """Its options only when it is the command: they import the study's tools."""
    bench = add_command(
        sub,
        "stage-bench",
        "measure staging throughput against cp, tar and the raw disk (CSV, PNG, markdown)",
        "mlhpc stage-bench --out runs/stage-bench --total-mib 512 --file-kib 64,1024,65536",
    )
    if command in (None, "stage-bench"):
        from mlhpc.study.bench import add_bench_arguments

        add_bench_arguments(bench)
    bench.set_defaults(handler=_stage_bench)


def _stage_bench(args: argparse.Namespace) -> int:
    from mlhpc.study.bench import run_bench

    return run_bench(args)
