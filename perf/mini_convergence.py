"""Epochs to target of a benchmark's mini config over many seeds: does the mini measure convergence?

    python perf/mini_convergence.py BENCHMARK [--seeds 1-10|3,17|random:20] [--config mini]
                                    [--record FILE] [key=value ...]
    python perf/mini_convergence.py --summary FILE

Generates the config's synthetic dataset once (in --work, reused when it is there; a second
process on the same --work waits for the first one's generation), then trains one run per seed
through the shared loop in this process (no staging: the data is read where it was generated),
each to its target or its max_epochs. Prints each seed's epochs and metrics and, last,
`epochs to target: mean M, cv C` over the seeds that reached it. The goal for a mini: every seed
reaches the target in 3 to 10 epochs, with a coefficient of variation under 30 %.

A long measurement runs in chunks (a few seeds per process, several processes at once): each
appends one JSON line per seed to --record FILE, and --summary FILE gives the figures over all of
them (seeds, epochs each, range, mean, cv, wall seconds per run).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests.helpers.toy_benchmark; an installed mlhpc comes first

from mlhpc.common.cluster.distributed import init_distributed  # noqa: E402
from mlhpc.common.contract import registry  # noqa: E402
from mlhpc.common.contract.config import load_config  # noqa: E402
from mlhpc.common.safeio.locks import FolderBusy  # noqa: E402
from mlhpc.generation import generate_dataset  # noqa: E402
from tests.helpers.toy_benchmark import run_toy  # noqa: E402

WAIT_FOR_GENERATION_S = 900.0
"""How long a process waits for another one's generation into the same --work folder."""


def seed_range(text: str) -> list[int]:
    """`1-10`, `4`, `3,17,22`, or `random:20` (20 seeds drawn now, printed so a run can be repeated)."""
    if text.startswith("random:"):
        return sorted(random.sample(range(1, 2**31), int(text.split(":", 1)[1])))
    if "," in text:
        return [int(part) for part in text.split(",")]
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def summarize(records: list[dict[str, Any]]) -> list[str]:
    """The figures over per-seed records: seeds and epochs, how many reached, range, mean, cv, wall."""
    reached = [r for r in records if r["reached"]]
    lines = [
        "seeds (epochs): "
        + ", ".join(f"{r['seed']} ({r['epochs'] if r['reached'] else 'not reached'})" for r in records),
        f"reached: {len(reached)} of {len(records)} seeds",
    ]
    if reached:
        epochs = [r["epochs"] for r in reached]
        mean = statistics.mean(epochs)
        lines.append(f"range {min(epochs)}-{max(epochs)}")
        lines.append(f"epochs to target: mean {mean:.1f}, cv {statistics.pstdev(epochs) / mean:.0%}")
    else:
        lines.append("epochs to target: no seed reached the target")
    seconds = [r["seconds"] for r in records]
    lines.append(
        f"wall per run: median {statistics.median(seconds):.0f} s, {min(seconds):.0f}-{max(seconds):.0f} s"
    )
    return lines


def read_records(path: Path) -> list[dict[str, Any]]:
    """The per-seed records of a --record file, each seed once (its last record), sorted by seed."""
    by_seed = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            by_seed[record["seed"]] = record
    return [by_seed[seed] for seed in sorted(by_seed)]


def _generate(data_dir: Path, write: Any) -> bool:
    """generate_dataset, waiting while another process of this script generates into the folder."""
    deadline = time.monotonic() + WAIT_FOR_GENERATION_S
    while True:
        try:
            return generate_dataset(data_dir, write, reuse_complete=True, not_ours_fix="pass another --work")
        except FolderBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("benchmark", nargs="?")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. loop.max_epochs=12")
    parser.add_argument("--config", default="mini")
    parser.add_argument(
        "--seeds", default="1-10", help="a range (1-10), one seed, a list (3,17,22) or random:N"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/mlhpc_mini_convergence"))
    parser.add_argument("--record", type=Path, help="append one JSON line per seed to this file")
    parser.add_argument("--summary", type=Path, help="print the figures over a --record file and exit")
    args = parser.parse_intermixed_args()
    if args.summary is None and args.benchmark is None:
        parser.error("name a benchmark, or pass --summary FILE")
    return args


def one_seed(
    args: argparse.Namespace, bench: Any, cfg: Any, ctx: Any, data_dir: Path, seed: int
) -> dict[str, Any]:
    """Train one seed to the target (or the epoch cap) and print its line."""
    started = time.perf_counter()
    result = run_toy(cfg, ctx, None, seed=seed, bench=bench, data_dir=data_dir)
    record = {
        "benchmark": bench.name,
        "config": args.config,
        "overrides": args.overrides,
        "seed": seed,
        "reached": result.status == "success",
        "epochs": result.epochs,
        "seconds": round(time.perf_counter() - started, 1),
        "metrics": [round(m, 4) for m in result.metrics],
    }
    print(
        f"seed {seed}: {'reached' if record['reached'] else 'NOT reached'} in {result.epochs} epochs "
        f"({record['seconds']:.0f} s), {bench.target.metric} " + " ".join(f"{m:.3f}" for m in result.metrics),
        flush=True,
    )
    return record


def main() -> None:
    args = parse_args()
    if args.summary is not None:
        print("\n".join(summarize(read_records(args.summary))))
        return
    bench = registry.get(args.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(args.config), args.overrides)
    # One dataset per config and data overrides (the data.* settings decide what is generated).
    data_keys = "_".join(sorted(o for o in args.overrides if o.startswith("data."))) or "default"
    data_dir = args.work / f"{bench.name}-{args.config}-{data_keys.replace('/', '_')}"
    started = time.perf_counter()
    if _generate(data_dir, lambda folder: bench.generate(cfg, folder)):
        print(f"generated {data_dir} in {time.perf_counter() - started:.0f} s", flush=True)
    ctx = init_distributed("auto", "cpu")
    records: list[dict[str, Any]] = []
    seeds = seed_range(args.seeds)
    print(f"seeds: {','.join(map(str, seeds))}", flush=True)
    for seed in seeds:
        records.append(one_seed(args, bench, cfg, ctx, data_dir, seed))
        if args.record is not None:
            with args.record.open("a", encoding="utf-8") as handle:  # one line per seed: chunks append
                handle.write(json.dumps(records[-1]) + "\n")
    print("\n".join(summarize(records)[1:]))


if __name__ == "__main__":
    main()
