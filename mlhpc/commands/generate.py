"""`mlhpc generate BENCHMARK --out DIR`: synthetic data in the benchmark's real on-disk format."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mlhpc.commands import ALLOW_SIZE_HELP, add_command, size_argument
from mlhpc.common.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    gen = add_command(
        sub,
        "generate",
        "write synthetic data in the benchmark's real on-disk format",
        "mlhpc generate cosmoflow --config mini --out data/cosmoflow-mini",
    )
    gen.add_argument("benchmark")
    gen.add_argument("--config", default="mini", help="mini, full, or a YAML path (default mini)")
    gen.add_argument("--out", type=Path, required=True, help="dataset directory to write")
    gen.add_argument("--samples", type=int, default=None, help="training samples (default: the config's)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--allow-size", type=size_argument, default=None, metavar="SIZE", help=ALLOW_SIZE_HELP)
    gen.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="config overrides (optional)"
    )
    gen.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from mlhpc.common.contract import catalog
    from mlhpc.common.contract.config import load_config
    from mlhpc.common.safeio.writable import check_writable_dir
    from mlhpc.dataset_size import dataset_bytes
    from mlhpc.generation import SizeCheck, check_size, generate_dataset

    if args.samples is not None and args.samples < 1:
        raise ConfigError(
            f"--samples {args.samples}: a dataset needs at least 1 training sample; pass --samples 1 "
            "or more, or leave it out for the config's data.num_train_samples"
        )
    info = catalog.info(args.benchmark)
    cfg = load_config(info.config_class, info.config_path(args.config), args.overrides)
    check_writable_dir(args.out, "--out")
    size = SizeCheck(
        expected=dataset_bytes(info.name, cfg, args.samples),
        allow=args.allow_size,
        what=f"mlhpc generate {info.name} --config {args.config}",
        fix="pass --samples N for a smaller one",
    )
    check_size(args.out, size, reuse_complete=False)  # before torch is imported: a refusal is quick
    from mlhpc.common.contract import registry

    bench = registry.get(info.name)
    started = time.perf_counter()
    generate_dataset(
        args.out,
        lambda folder: bench.generate(cfg, folder, num_samples=args.samples, seed=args.seed),
        reuse_complete=False,
        not_ours_fix="pass a new or empty --out, or move them away",
        size=size,
    )
    print(f"wrote {bench.name} data to {args.out} in {time.perf_counter() - started:.1f} s")
    return 0
