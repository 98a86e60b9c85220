"""What the shared loop costs per training step, against a bare PyTorch loop, in one run.

    python perf/loop_overhead.py [--device cpu|cuda] [--config mini] [--steps 32] [--epochs 2] [--rounds 11] [--threads N]

The same CosmoFlow model, optimizer, LR schedule and batches (already in memory, on the device)
go through `train_to_target`'s epoch loop and through a bare loop of forward, backward, optimizer
and scheduler step, in the same precision (autocast) and memory format as the loop resolves them
(on a GPU: `channels_last_3d`; bf16 when `--set loop.precision=bf16`), with cuDNN autotuning on for
both. Each epoch is timed from its first batch to the end of its last step (wall, and
CPU of this process; a device sync at the end on a GPU), so ours holds the phase timers, the
device-side NaN check and the first step's FLOP counter. Rounds alternate which goes first. The
last line is `loop overhead: R`, R the median over rounds of our wall time per step over the bare
loop's (the CPU ratio beside it is steadier on a busy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests.helpers.toy_benchmark; an installed mlhpc comes first

from mlhpc.common.cluster.distributed import DistContext, init_distributed  # noqa: E402
from mlhpc.common.contract import registry  # noqa: E402
from mlhpc.common.contract.config import load_config  # noqa: E402
from mlhpc.common.contract.registry import DataBundle  # noqa: E402
from mlhpc.common.training.batches import MEMORY_FORMATS, to_device  # noqa: E402
from mlhpc.common.training.loop import resolve_memory_format  # noqa: E402
from tests.helpers.toy_benchmark import run_toy  # noqa: E402

COSMOFLOW = registry.get("cosmoflow")


def make_batches(cfg: Any, steps: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Made on the device, already in the loop's memory format (its per-step conversion is then a
    no-op for both loops, as with a loader that delivers that layout)."""
    generator = torch.Generator(device=device).manual_seed(0)
    size, channels = cfg.data.sample_size, cfg.data.num_channels
    batch = cfg.loop.global_batch_size
    memory_format = resolve_memory_format(cfg.loop, COSMOFLOW, device)
    shape = (batch, channels, size, size, size)
    return [
        to_device(
            (
                torch.rand(shape, generator=generator, device=device),
                torch.rand(batch, 4, generator=generator, device=device),
            ),
            device,
            memory_format,
        )
        for _ in range(steps)
    ]


class TimedBatches:
    """The epoch's batches; times (wall and CPU of this process) from the first batch asked for to
    the end of the epoch, which the loop sees after its last step's optimizer step."""

    def __init__(self, batches: list, device: torch.device) -> None:
        self.batches, self.device = batches, device
        self.wall = self.cpu = 0.0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield from self.batches
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu


def ours(cfg: Any, batches: list, ctx: DistContext) -> TimedBatches:
    train = TimedBatches(batches, ctx.device)
    data = DataBundle(train=train, validation=batches[:1], train_samples=0, eval_samples=0)
    run_toy(cfg, ctx, None, bench=dataclasses.replace(COSMOFLOW, build_data=lambda *args: data))
    return train


def autocast(cfg: Any, device: torch.device) -> Any:
    """The loop's precision: autocast to bf16/fp16, or nothing for fp32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.loop.precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def bare(cfg: Any, batches: list, ctx: DistContext) -> TimedBatches:
    """The same epochs as a bare loop: forward, backward, step, zero_grad, scheduler step; the
    loop's precision and memory format (an fp16 run has no GradScaler here: compare fp32 or bf16)."""
    torch.manual_seed(1)
    memory_format = resolve_memory_format(cfg.loop, COSMOFLOW, ctx.device)
    train = TimedBatches(batches, ctx.device)
    model = COSMOFLOW.build_model(cfg).to(ctx.device, memory_format=MEMORY_FORMATS[memory_format])
    optimizer, scheduler = COSMOFLOW.build_optimizer(cfg, model, ctx, len(batches))
    for _ in range(cfg.loop.max_epochs):
        model.train()
        for batch in train:
            with autocast(cfg, ctx.device):
                loss = COSMOFLOW.compute_loss(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        model.eval()
        with torch.no_grad(), autocast(cfg, ctx.device):
            COSMOFLOW.evaluate(model, train.batches[:1], ctx)
    return train


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--config", default="mini", help="a CosmoFlow config (mini, full, or a YAML path)")
    parser.add_argument("--batch", type=int, default=0, help="global batch size (default: the config's)")
    parser.add_argument("--steps", type=int, default=32, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--set", nargs="*", default=[], help="more config overrides, e.g. loop.precision=bf16"
    )
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    overrides = [f"loop.max_epochs={args.epochs}", "loop.target=0.0", *args.set]
    if args.batch:
        overrides.append(f"loop.global_batch_size={args.batch}")
    cfg = load_config(COSMOFLOW.config_class, COSMOFLOW.config_path(args.config), overrides)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True  # fixed shapes, as NVIDIA's implementations set it
    ctx = init_distributed("auto", args.device)
    batches = make_batches(cfg, args.steps, ctx.device)
    steps = args.steps * args.epochs
    print(
        f"loop_overhead: CosmoFlow {args.config}, batch {cfg.loop.global_batch_size}, {args.steps} steps x "
        f"{args.epochs} epochs, {args.rounds} rounds, device {ctx.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, precision {cfg.loop.precision}, memory format "
        f"{resolve_memory_format(cfg.loop, COSMOFLOW, ctx.device)} (both loops)"
    )
    walls, cpus = [], []
    ours(cfg, batches, ctx)  # warm-up: allocator, kernels, first imports
    for round_ in range(args.rounds):
        if round_ % 2:
            mine, base = ours(cfg, batches, ctx), bare(cfg, batches, ctx)
        else:
            base, mine = bare(cfg, batches, ctx), ours(cfg, batches, ctx)
        walls.append(mine.wall / base.wall)
        cpus.append(mine.cpu / base.cpu)
        print(
            f"round {round_ + 1}: ours {1e3 * mine.wall / steps:.2f} ms/step ({1e3 * mine.cpu / steps:.2f} CPU), "
            f"bare {1e3 * base.wall / steps:.2f} ms/step ({1e3 * base.cpu / steps:.2f} CPU), "
            f"wall ratio {walls[-1]:.3f}, CPU ratio {cpus[-1]:.3f}"
        )
    for name, ratios in (("wall", walls), ("CPU", cpus)):
        print(
            f"{name} ratio: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}"
        )
    print(f"loop overhead: {statistics.median(walls):.3f}")


if __name__ == "__main__":
    main()
