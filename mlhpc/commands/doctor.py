"""`mlhpc doctor [BENCHMARK]`: check this Python environment for a benchmark (or all of them)
before a run does: the work is mlhpc/environment.py's."""

from __future__ import annotations

import argparse

from mlhpc.commands import add_command


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    doctor = add_command(
        sub,
        "doctor",
        "check torch, torchvision, a benchmark's imports and the device (exit 0 fine, 2 not)",
        "mlhpc doctor deepcam --device cuda\nmlhpc doctor   # every installed benchmark",
    )
    doctor.add_argument("benchmark", nargs="?", default=None, help="one benchmark (default: all)")
    doctor.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="the device a run will ask for"
    )
    doctor.add_argument(
        "--config", default=None, help="the config a run will use (data.loader=dali checks DALI)"
    )
    doctor.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from mlhpc.common.contract import catalog
    from mlhpc.environment import check_environment

    names = [catalog.info(args.benchmark).name] if args.benchmark else catalog.names()
    cfg = None
    if args.config is not None and args.benchmark is not None:
        from mlhpc.campaign.io import resolve_config

        cfg = resolve_config(args.benchmark, args.config, ()).cfg
    for line in check_environment(names, cfg, args.device):  # a problem: one line, exit 2 (cli)
        print(f"ok  {line}")
    print("the environment is ready" + (f" for {args.benchmark}" if args.benchmark else ""))
    return 0
