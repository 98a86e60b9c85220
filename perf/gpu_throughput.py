"""Training-step throughput of the full-size CosmoFlow and DeepCAM models through the shared loop.

    python perf/gpu_throughput.py [--device cuda] [--precisions fp32 bf16] [--compile both]
                                  [--markdown FILE] [--smoke]

Each case trains the benchmark's `full` model through `train_to_target` on synthetic batches that
are already on the device (so this is the step rate, not the data pipeline's), for two short
epochs, and reads the samples/s of the second one as the loop logs it in `tracked_stats` (the
first holds the warm-up and, compiled, the compilation). Prints one table, samples/s per GPU beside
the published per-GPU figures of MLPerf HPC v3.0, and with --markdown writes it there too.
`--smoke` shrinks the models' inputs so that the script runs in seconds on a CPU (the test suite
runs it that way, so that it does not rot between GPU sessions).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests.toy_benchmark; an installed mlhpc comes first

from mlhpc.common import registry  # noqa: E402
from mlhpc.common.config import load_config  # noqa: E402
from mlhpc.common.distributed import DistContext, init_distributed  # noqa: E402
from mlhpc.common.registry import DataBundle  # noqa: E402
from tests.toy_benchmark import run_toy  # noqa: E402

PUBLISHED = {
    # Samples/s per accelerator, median of the logged tracked_stats.throughput in MLPerf HPC v3.0
    # closed results (NVIDIA Eos, H100; Perlmutter, A100).
    "cosmoflow": {"H100": 200.0, "A100": 91.0},
    "deepcam": {"H100": 30.0, "A100": 21.0},
}
LOCAL_BATCH = {"cosmoflow": 8, "deepcam": 4}
SMOKE = {
    "cosmoflow": ["data.sample_size=16"],
    "deepcam": ["data.height=64", "data.width=96", "model.width_multiplier=0.0625", "model.middle_blocks=1"],
}


def synthetic_batches(name: str, cfg: Any, steps: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    batch = cfg.loop.global_batch_size
    batches = []
    for _ in range(steps):
        if name == "cosmoflow":
            size = cfg.data.sample_size
            inputs = torch.rand(batch, cfg.data.num_channels, size, size, size, generator=generator)
            labels = torch.rand(batch, 4, generator=generator)
        else:
            height, width = cfg.data.height, cfg.data.width
            inputs = torch.randn(batch, cfg.data.num_channels, height, width, generator=generator)
            labels = torch.randint(0, 3, (batch, height, width), generator=generator)
        batches.append((inputs.to(device), labels.to(device)))
    return batches


def measure(name: str, precision: str, compiled: bool, args: argparse.Namespace, ctx: DistContext) -> dict:
    bench = registry.get(name)
    overrides = [
        f"loop.global_batch_size={args.batch or LOCAL_BATCH[name]}",
        "loop.max_epochs=2",
        f"loop.target={0.0 if bench.target.direction == 'min' else 1.01}",
        f"loop.precision={precision}",
        f"loop.compile={str(compiled).lower()}",
        *(SMOKE[name] if args.smoke else []),
    ]
    cfg = load_config(bench.config_class, bench.config_path("full"), overrides)
    batches = synthetic_batches(name, cfg, args.steps, ctx.device)
    data = DataBundle(train=batches, validation=batches[:1], train_samples=0, eval_samples=0)
    started = time.perf_counter()
    result = run_toy(cfg, ctx, None, bench=dataclasses.replace(bench, build_data=lambda *_: data))
    settings = result.breakdown.settings if result.breakdown is not None else {}
    return {
        "benchmark": name,
        "precision": precision,
        "compiled": compiled,
        "batch": cfg.loop.global_batch_size,
        "memory_format": settings.get("memory_format", "?"),
        "samples_per_s": result.train_samples_per_s,
        "seconds": time.perf_counter() - started,
    }


def table(rows: list[dict], device_name: str) -> str:
    kind = "H100" if "H100" in device_name else "A100" if "A100" in device_name else None
    lines = [
        "| benchmark | precision | compiled | batch/GPU | memory format | samples/s per GPU | "
        "published H100 | published A100 | ours / published (same GPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        published = PUBLISHED[row["benchmark"]]
        ratio = f"{row['samples_per_s'] / published[kind]:.2f}" if kind else "n/a (other device)"
        lines.append(
            f"| {row['benchmark']} | {row['precision']} | {'yes' if row['compiled'] else 'no'} | {row['batch']} | "
            f"{row['memory_format']} | {row['samples_per_s']:.1f} | {published['H100']:.0f} | "
            f"{published['A100']:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--benchmarks", nargs="+", default=["cosmoflow", "deepcam"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--compile", default="both", choices=["no", "yes", "both"])
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (two epochs per case)")
    parser.add_argument("--batch", type=int, default=0, help="batch per GPU (default: cosmoflow 8, deepcam 4)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--smoke", action="store_true", help="small inputs: a CPU check of the script itself")
    args = parser.parse_args()

    ctx = init_distributed("auto", args.device)
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "CPU"
    compile_modes = {"no": [False], "yes": [True], "both": [False, True]}[args.compile]
    rows = []
    for name in args.benchmarks:
        for precision in args.precisions:
            for compiled in compile_modes:
                row = measure(name, precision, compiled, args, ctx)
                rows.append(row)
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()  # the case's batches and model are gone
                print(
                    f"{name} {precision} compiled={compiled}: {row['samples_per_s']:.1f} samples/s "
                    f"({row['seconds']:.0f} s for the case)",
                    flush=True,
                )
    text = table(rows, device_name)
    header = f"Device: {device_name}; torch {torch.__version__}; synthetic batches on the device, {args.steps} steps per epoch."
    print(header)
    print(text)
    if args.markdown:
        args.markdown.write_text(f"{header}\n\n{text}\n")


if __name__ == "__main__":
    main()
