"""The systems/<system>.json a submission carries, filled in from this machine."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from mlhpc.common.distributed import DistContext


def default_system_name(ctx: DistContext) -> str:
    kind = "gpu" if ctx.device.type == "cuda" else "cpu"
    return f"{platform.node().split('.')[0] or 'host'}_{kind}_n{ctx.world_size}"


def describe_system(
    ctx: DistContext, *, submitter: str, division: str, status: str, system: str
) -> dict[str, Any]:
    """A system description with the fields the MLPerf package checker requires."""
    cuda = ctx.device.type == "cuda"
    return {
        "submitter": submitter,
        "division": division,
        "status": status,
        "system_name": system,
        "number_of_nodes": str(ctx.num_nodes),
        "host_processors_per_node": "1",
        "host_processor_model_name": _cpu_model(),
        "host_processor_core_count": str(os.cpu_count() or 1),
        "host_memory_capacity": _memory(),
        "accelerators_per_node": str(ctx.local_world_size if cuda else 0),
        "accelerator_model_name": torch.cuda.get_device_name(ctx.device) if cuda else "none",
        "framework": f"PyTorch {torch.__version__}",
        "operating_system": f"{platform.system()} {platform.release()}",
        "hw_notes": "",
        "sw_notes": f"mlhpc; launcher {ctx.launcher}; backend {ctx.backend}",
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return f"{pages / 2**30:.0f} GB"
    except (ValueError, OSError, AttributeError):
        return "unknown"
