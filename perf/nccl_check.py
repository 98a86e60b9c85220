"""The NCCL path on this machine's GPUs: a process group, DDP's gradient all-reduce and the loop's
collectives (sum and max), with the time of one large all-reduce.

    torchrun --standalone --nproc_per_node=<GPUs> perf/nccl_check.py

Prints one line per rank and, on rank 0, `nccl: ok ...` (or the error). A 1-GPU group still goes
through NCCL's communicator, DDP's reducer and the collectives' kernels.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=2))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).to(device), device_ids=[device.index])
    model(torch.randn(32, 256, device=device)).square().mean().backward()
    grads_equal = all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    total = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(total)
    peak = torch.tensor([float(rank)], device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    big = torch.ones(64 * 2**20, device=device)  # 256 MiB of fp32
    dist.all_reduce(big)  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    dist.all_reduce(big)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    ok = grads_equal and total.item() == world * (world + 1) / 2 and peak.item() == world - 1
    print(f"rank {rank}: sum {total.item():.0f}, max {peak.item():.0f}, ddp grads {'ok' if grads_equal else 'bad'}")
    if rank == 0:
        print(
            f"nccl: {'ok' if ok else 'WRONG RESULTS'}, {world} rank(s), NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
            f"all-reduce of 256 MiB in {1e3 * seconds:.2f} ms"
        )
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
