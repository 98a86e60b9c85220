"""`mlhpc characterize BENCHMARK`: why this system trains as fast as it does, level by level
(the work is mlhpc.characterize's); `--compare A B` puts two characterizations side by side."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mlhpc.commands import add_command
from mlhpc.common.errors import ConfigError


def _batches(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(word) for word in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give batch sizes as 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every batch size must be at least 1")
    return tuple(sorted(set(sizes)))


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    cmd = add_command(
        sub,
        "characterize",
        "why a system trains as fast as it does: analytic FLOPs and bytes, operators, memory, "
        "roofline, I/O and communication, as JSON and one HTML page",
        "mlhpc characterize cosmoflow --config mini --out char/cpu\n"
        "mlhpc characterize deepcam --config full --analytic --out char/deepcam-full\n"
        "mlhpc characterize --compare char/cpu char/gpu --out char/cpu-vs-gpu",
    )
    cmd.add_argument("benchmark", nargs="?", help="the benchmark (not with --compare)")
    cmd.add_argument("--config", default="mini", help="mini, full, or a YAML path (default mini)")
    cmd.add_argument("--out", type=Path, required=True, help="the folder characterize.json and the page go in")
    cmd.add_argument("--analytic", action="store_true", help="only the analytic level: no data, no timing")
    cmd.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu or cuda")
    cmd.add_argument("--batch-size", type=int, default=None, help="per-rank batch of the timed levels")
    cmd.add_argument("--steps", type=int, default=3, help="timed steps per level (default 3)")
    cmd.add_argument("--memory-batches", type=_batches, default=None, help="memory level batch sizes, e.g. 1,2,4")
    cmd.add_argument("--io-samples", type=int, default=8, help="samples the I/O level reads (default 8)")
    cmd.add_argument("--data", type=Path, default=None, help="a dataset for the I/O level (default: generated)")
    cmd.add_argument("--ranks", type=int, default=2, help="processes of the communication level (default 2)")
    cmd.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        default=None,
        help="two characterize folders or JSON files: one page, level by level",
    )
    cmd.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides")
    cmd.set_defaults(handler=_characterize)


def _characterize(args: argparse.Namespace) -> int:
    if args.compare is not None:
        if args.benchmark is not None:
            raise ConfigError("mlhpc characterize --compare A B takes no benchmark; drop the benchmark name")
        from mlhpc.characterize.compare import compare_command

        page = compare_command(*args.compare, out=args.out)
        print(f"comparison page: {page}")
        return 0
    if args.benchmark is None:
        raise ConfigError("mlhpc characterize: name a benchmark (e.g. cosmoflow), or pass --compare A B")
    from mlhpc.common.contract import catalog

    if catalog.info(args.benchmark).workload == "automl":  # its trials are a search, not the loop's step
        raise ConfigError(
            f"mlhpc characterize times the training loop's step; {args.benchmark} is an AutoML search: "
            f"mlhpc run {args.benchmark} --dry-run gives its seed's operations a sample"
        )
    for flag, value in (("--steps", args.steps), ("--io-samples", args.io_samples), ("--ranks", args.ranks)):
        if value < 1:
            raise ConfigError(f"mlhpc characterize {flag} {value}: it must be at least 1")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"mlhpc characterize --batch-size {args.batch_size}: it must be at least 1")
    # Before torch loads: the profiler's own library (Kineto) otherwise prints a line to stderr at
    # every start and stop, and an error line on a machine without a GPU.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from mlhpc.characterize.runner import PAGE_NAME, CharacterizeOptions, characterize

    options = CharacterizeOptions(
        benchmark=args.benchmark,
        config=args.config,
        overrides=tuple(args.overrides),
        out=args.out,
        analytic_only=args.analytic,
        device=args.device,
        batch_size=args.batch_size,
        steps=args.steps,
        memory_batches=args.memory_batches,
        io_samples=args.io_samples,
        data=args.data,
        ranks=args.ranks,
    )
    characterize(options)
    print(f"characterization: {args.out / 'characterize.json'} and {args.out / PAGE_NAME}")
    return 0
