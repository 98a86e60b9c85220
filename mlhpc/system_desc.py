"""The systems/<system>.json a submission carries, filled in from this machine and merged into
the one already there."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch

from mlhpc.common.distributed import DistContext
from mlhpc.common.errors import SubmissionError
from mlhpc.common.fileio import atomic_write_json

# The fields a run's logs and results depend on: an existing file must agree with the run.
RUN_FIELDS: dict[str, str] = {
    "submitter": "--submitter",
    "division": "--division",
    "status": "--status",
    "system_name": "--system",
}


def stable_system_name(ctx: DistContext) -> str:
    """A system name from the hardware, the same on every node and container of one machine type
    (the host name is not: in a container it is the container's random id): the GPU's or else
    the CPU's model, the device kind and the ranks, e.g. `nvidia_h100_80gb_hbm3_gpu_n8`."""
    cuda = ctx.device.type == "cuda"
    model = torch.cuda.get_device_name(ctx.device) if cuda else _cpu_model()
    return hardware_slug(model, "gpu" if cuda else "cpu", ctx.world_size)


def hardware_slug(model: str, kind: str, ranks: int) -> str:
    """`model` as a folder name without vendor marks and clock speed, then kind and ranks."""
    text = re.sub(r"\((r|tm|c)\)|\bcpu\b|\bprocessor\b|@.*$|\d+-core", " ", model.lower())
    slug = re.sub(r"[^a-z0-9]+", "_", text).strip("_")[:48].strip("_") or "unknown"
    return f"{slug}_{kind}_n{ranks}"


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


def merge_system_json(path: Path, description: dict[str, Any]) -> dict[str, Any]:
    """The JSON at `path` (if any) with `description`'s missing fields added. Every field already
    there is kept: hand-added ones, and measured ones such as `framework` that a user may have
    corrected (or an earlier run wrote), so a run never overwrites them. A RUN_FIELDS value that
    differs from the run's is a SubmissionError naming the file, the field, both values and the fix."""
    return _merged(path, _read_fields(path), description)


def write_system_json(path: Path, description: dict[str, Any]) -> None:
    """`merge_system_json`, written to `path` only when it adds a field (the file is read once)."""
    existing = _read_fields(path)
    merged = _merged(path, existing, description)
    if merged != existing:
        atomic_write_json(path, merged)


def _read_fields(path: Path) -> dict[str, Any] | None:
    """The system description at `path`, or None when there is none."""
    if not path.is_file():
        return None
    try:
        existing = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SubmissionError(f"cannot read {path} ({e}); fix it or move it away") from e
    if not isinstance(existing, dict):
        raise SubmissionError(f"{path} is not a JSON object of system fields; fix it or move it away")
    return existing


def _merged(path: Path, existing: dict[str, Any] | None, description: dict[str, Any]) -> dict[str, Any]:
    if existing is None:
        return dict(description)
    for name, flag in RUN_FIELDS.items():
        if name in existing and name in description and existing[name] != description[name]:
            fix = (
                f"pass {flag} {existing[name]}, or another --system or --out"
                if name != "system_name"
                else "make it the file's name, or pass another --system"
            )
            raise SubmissionError(
                f"{path} has {name}={existing[name]!r} but this run's is {description[name]!r}; {fix}"
            )
    return {**existing, **{k: v for k, v in description.items() if k not in existing}}


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
