"""Epochs to target of a benchmark's mini config over many seeds: does the mini measure convergence?

    python perf/mini_convergence.py BENCHMARK [--seeds 1-10|3,17|random:20] [--config mini] [key=value ...]

Generates the config's synthetic dataset once (in --work, reused when it is there), then trains
one run per seed through the shared loop in this process (no staging: the data is read where it
was generated), each to its target or its max_epochs. Prints each seed's epochs and metrics and,
last, `epochs to target: mean M, cv C` over the seeds that reached it. The goal for a mini: every
seed reaches the target in 3 to 10 epochs, with a coefficient of variation under 30 %.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests.toy_benchmark; an installed mlhpc comes first

from mlhpc.common import registry  # noqa: E402
from mlhpc.common.config import load_config  # noqa: E402
from mlhpc.common.distributed import init_distributed  # noqa: E402
from mlhpc.generation import generate_dataset  # noqa: E402
from tests.toy_benchmark import run_toy  # noqa: E402


def seed_range(text: str) -> list[int]:
    """`1-10`, `4`, `3,17,22`, or `random:20` (20 seeds drawn now, printed so a run can be repeated)."""
    if text.startswith("random:"):
        return sorted(random.sample(range(1, 2**31), int(text.split(":", 1)[1])))
    if "," in text:
        return [int(part) for part in text.split(",")]
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. loop.max_epochs=12")
    parser.add_argument("--config", default="mini")
    parser.add_argument("--seeds", default="1-10", help="a range (1-10), one seed, a list (3,17,22) or random:N")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mlhpc_mini_convergence"))
    args = parser.parse_intermixed_args()

    bench = registry.get(args.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(args.config), args.overrides)
    # One dataset per config and data overrides (the data.* settings decide what is generated).
    data_keys = "_".join(sorted(o for o in args.overrides if o.startswith("data."))) or "default"
    data_dir = args.work / f"{bench.name}-{args.config}-{data_keys.replace('/', '_')}"
    started = time.perf_counter()
    if generate_dataset(
        data_dir, lambda folder: bench.generate(cfg, folder), reuse_complete=True, not_ours_fix="pass another --work"
    ):
        print(f"generated {data_dir} in {time.perf_counter() - started:.0f} s", flush=True)
    ctx = init_distributed("auto", "cpu")
    epochs: list[int] = []
    seeds = seed_range(args.seeds)
    print(f"seeds: {','.join(map(str, seeds))}", flush=True)
    for seed in seeds:
        started = time.perf_counter()
        result = run_toy(cfg, ctx, None, seed=seed, bench=bench, data_dir=data_dir)
        reached = result.status == "success"
        if reached:
            epochs.append(result.epochs)
        print(
            f"seed {seed}: {'reached' if reached else 'NOT reached'} in {result.epochs} epochs "
            f"({time.perf_counter() - started:.0f} s), {bench.target.metric} "
            + " ".join(f"{m:.3f}" for m in result.metrics),
            flush=True,
        )
    if epochs:
        mean = statistics.mean(epochs)
        cv = statistics.pstdev(epochs) / mean
        print(f"reached: {len(epochs)} of {len(seeds)} seeds, range {min(epochs)}-{max(epochs)}")
        print(f"epochs to target: mean {mean:.1f}, cv {cv:.0%}")
    else:
        print("epochs to target: no seed reached the target")


if __name__ == "__main__":
    main()
