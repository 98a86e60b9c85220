"""Training-step throughput of the full-size CosmoFlow and DeepCAM models through the shared loop.

    python perf/gpu_throughput.py [--device cuda] [--cases cosmoflow:bf16:compiled ...]
                                  [--markdown FILE] [--smoke]

Each case (benchmark:precision:eager|compiled) trains the benchmark's `full` model through
`train_to_target` on synthetic batches made on the device (so this is the step rate, not the data
pipeline's), for two short epochs, and reads the samples/s of the second one as the loop logs it in
`tracked_stats` (the first holds the warm-up and, compiled, the compilation). cuDNN autotuning is
on (`cudnn.benchmark`, as NVIDIA's implementations set it for their fixed shapes); "fp32" is
torch's default: TF32 convolutions, full fp32 matmuls (the header line says which). Prints one
table, samples/s per GPU beside the published per-GPU figures of MLPerf HPC v3.0; --markdown
rewrites the file after every case, so a run stopped by its time limit keeps the cases done.
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
sys.path.append(str(REPO))  # for tests.helpers.toy_benchmark; an installed mlhpc comes first

from mlhpc.common.cluster.distributed import DistContext, init_distributed  # noqa: E402
from mlhpc.common.contract import registry  # noqa: E402
from mlhpc.common.contract.config import load_config  # noqa: E402
from mlhpc.common.contract.registry import DataBundle  # noqa: E402
from tests.helpers.toy_benchmark import run_toy  # noqa: E402

PRECISIONS = ["fp32", "bf16", "fp16"]
MODES = ["eager", "compiled"]

PUBLISHED = {
    # Samples/s per accelerator, median of the logged tracked_stats.throughput in MLPerf HPC v3.0
    # closed results (NVIDIA Eos, H100; Perlmutter, A100).
    "cosmoflow": {"H100": 200.0, "A100": 91.0},
    "deepcam": {"H100": 30.0, "A100": 21.0},
}
LOCAL_BATCH = {"cosmoflow": 8, "deepcam": 4}
LEAN_CASES = [
    "cosmoflow:fp32:eager",
    "cosmoflow:bf16:eager",
    "cosmoflow:bf16:compiled",
    "deepcam:fp32:eager",
    "deepcam:bf16:eager",
]
"""The default: a few minutes on one H100. A full DeepCAM compile takes minutes: opt-in."""
DISTINCT_BATCHES = 4
"""Batches made per case and cycled: the step rate does not depend on their values."""
SMOKE = {
    "cosmoflow": ["data.sample_size=16"],
    "deepcam": ["data.height=64", "data.width=96", "model.width_multiplier=0.0625", "model.middle_blocks=1"],
}


def synthetic_batches(
    name: str, cfg: Any, steps: int, device: torch.device
) -> list[tuple[torch.Tensor, ...]]:
    """`steps` batches cycling over a few made on the device (no host generation, no copy)."""
    generator = torch.Generator(device=device).manual_seed(0)
    batch = cfg.loop.global_batch_size
    pool = []
    for _ in range(min(steps, DISTINCT_BATCHES)):
        if name == "cosmoflow":
            size = cfg.data.sample_size
            shape = (batch, cfg.data.num_channels, size, size, size)
            inputs = torch.rand(shape, generator=generator, device=device)
            labels = torch.rand(batch, 4, generator=generator, device=device)
        else:
            height, width = cfg.data.height, cfg.data.width
            shape = (batch, cfg.data.num_channels, height, width)
            inputs = torch.randn(shape, generator=generator, device=device)
            labels = torch.randint(0, 3, (batch, height, width), generator=generator, device=device)
        pool.append((inputs, labels))
    return [pool[i % len(pool)] for i in range(steps)]


def parse_case(text: str) -> tuple[str, str, bool]:
    """`cosmoflow:bf16:compiled` -> (name, precision, compiled); a bad case is one line."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in LOCAL_BATCH or parts[1] not in PRECISIONS or parts[2] not in MODES:
        raise SystemExit(
            f"gpu_throughput: bad case {text!r}; write benchmark:precision:mode with benchmark in "
            f"{sorted(LOCAL_BATCH)}, precision in {PRECISIONS}, mode in {MODES}"
        )
    return parts[0], parts[1], parts[2] == "compiled"


def fp32_means() -> str:
    """What "fp32" means on this device: the TF32 switches torch reads."""
    conv = "TF32" if torch.backends.cudnn.allow_tf32 else "fp32"
    matmul = "TF32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return f"fp32 = {conv} convolutions, {matmul} matmuls; cudnn.benchmark={torch.backends.cudnn.benchmark}"


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


def write_markdown(path: Path, header: str, text: str) -> None:
    """Rewritten after every case, through a temporary name: a stopped run keeps what it had."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{header}\n\n{text}\n")
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=LEAN_CASES, help="benchmark:precision:eager|compiled")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (two epochs per case)")
    parser.add_argument(
        "--batch", type=int, default=0, help="batch per GPU (default: cosmoflow 8, deepcam 4)"
    )
    parser.add_argument("--markdown", type=Path, help="also write the table to this file (after every case)")
    parser.add_argument("--smoke", action="store_true", help="small inputs: a CPU check of the script itself")
    args = parser.parse_args()
    cases = [parse_case(case) for case in args.cases]

    torch.backends.cudnn.benchmark = True  # fixed shapes: autotune each convolution once
    ctx = init_distributed("auto", args.device)
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "CPU"
    header = (
        f"Device: {device_name}; torch {torch.__version__}; synthetic batches made on the device, "
        f"{args.steps} steps per epoch; {fp32_means()}."
    )
    print(header, flush=True)
    rows = []
    for name, precision, compiled in cases:
        row = measure(name, precision, compiled, args, ctx)
        rows.append(row)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # the case's batches and model are gone
        print(
            f"{name} {precision} compiled={compiled}: {row['samples_per_s']:.1f} samples/s "
            f"({row['seconds']:.0f} s for the case)",
            flush=True,
        )
        if args.markdown:
            write_markdown(args.markdown, header, table(rows, device_name))
    print(table(rows, device_name))


if __name__ == "__main__":
    main()
