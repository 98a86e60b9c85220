"""`mlhpc characterize`: each level measured in turn on this machine, written as characterize.json
and one self-contained page beside it. Levels that cannot run here (no example batch, no second
device) are recorded as skipped with the reason; the page says so."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlhpc import __version__
from mlhpc.characterize.bench_workload import BenchWorkload, single_process_context, training_dtype
from mlhpc.characterize.page import GENERATOR
from mlhpc.common.cluster.allocator import keep_freed_memory
from mlhpc.common.cluster.threads import configure_threads
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio.fileio import atomic_write_json, atomic_write_text
from mlhpc.common.safeio.writable import json_kind, page_kind, refuse_output_over_inputs

FORMAT = "mlhpc-characterize/1"
"""The JSON's first key's value; `mlhpc characterize --compare` refuses any other."""
JSON_NAME = "characterize.json"
PAGE_NAME = "characterize.html"
TIMED_LEVELS = ("operators", "roofline", "memory", "io", "communication")
NO_EXAMPLE_BATCH = (
    "{name} has no example_batch function, which every level that runs the model needs "
    "(docs/ADDING_A_BENCHMARK.md)"
)
OUT_FILES = {JSON_NAME: json_kind(FORMAT), PAGE_NAME: page_kind(GENERATOR)}


@dataclass(frozen=True, kw_only=True)
class CharacterizeOptions:
    benchmark: str
    config: str
    overrides: tuple[str, ...] = ()
    out: Path
    analytic_only: bool = False
    device: str = "auto"
    batch_size: int | None = None
    """Per-rank batch of the timed levels; None: the config's global batch, at most 4."""
    steps: int = 3
    memory_batches: tuple[int, ...] | None = None
    """Batch sizes of the memory level; None: half the timed batch (at least 1) and the timed batch."""
    io_samples: int = 8
    data: Path | None = None
    """A dataset of the benchmark (the staged copy, say) for the I/O level; None: a few samples
    generated into a temporary folder beside --out, removed after."""
    ranks: int = 2
    """Processes of the communication level's group (gloo on a CPU, NCCL on GPUs)."""


def characterize(options: CharacterizeOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every level asked for, write the JSON and the page into `options.out`, return the JSON."""
    # Judged before any work: --out may hold only what characterize writes, and not the --data it reads.
    out = refuse_output_over_inputs(options.out, [options.data], "--out", folder=True, writes=OUT_FILES)
    options = dataclasses.replace(options, out=out)
    bench = registry.get(options.benchmark)
    cfg = load_config(bench.config_class, bench.config_path(options.config), list(options.overrides))
    device = _device(options.device)
    # As a training rank runs: its threads chosen for the CPUs it has, its freed memory kept.
    threads = configure_threads(ranks_on_node=1)
    allocator = keep_freed_memory() if device.type == "cpu" else None
    report: dict[str, Any] = {
        "format": FORMAT,
        "benchmark": bench.name,
        "config": options.config,
        "overrides": list(options.overrides),
        "precision": cfg.loop.precision,
        "system": {**system_facts(device), "threads": threads.as_record(), "allocator": allocator},
        "skipped": {},
    }
    from mlhpc.characterize import analytic, reference

    found = None
    if bench.example_batch is None:
        report["skipped"]["analytic"] = NO_EXAMPLE_BATCH.format(name=bench.name)
    else:
        say(f"characterize {bench.name} --config {options.config}: analytic level (no data, no timing)")
        try:
            found = analytic.analyze(bench, cfg)
        except analytic.NotOnMeta as reason:
            say(f"{str(reason).split(';')[0]}: counting it on the CPU, with real tensors")
            found = analytic.analyze(bench, cfg, device="cpu")
    report["analytic"] = dataclasses.asdict(found) if found is not None else None
    report["published"] = reference.compare(bench.name, options.config, found) if found is not None else None
    if options.analytic_only:
        report["skipped"].update(dict.fromkeys(TIMED_LEVELS, "--analytic: the timed levels were not run"))
    else:
        _timed_levels(report, options, bench, cfg, device, found, say)
    write(report, options.out)
    return report


def _timed_levels(
    report: dict[str, Any],
    options: CharacterizeOptions,
    bench: registry.Benchmark,
    cfg: Any,
    device: torch.device,
    found: Any | None,
    say: Callable[[str], None],
) -> None:
    from mlhpc.characterize import communication, io_level, memory, operators, roofline

    batch = options.batch_size or min(cfg.loop.global_batch_size, 4)
    kind = device.type
    if found is not None:
        largest = max((batch, *(options.memory_batches or ())))
        ranks_here = options.ranks if kind == "cpu" else 1
        _check_memory(found, largest, ranks_here, device)

    def workload(batch_size: int) -> BenchWorkload:
        return BenchWorkload(bench.name, options.config, options.overrides, batch_size, kind)

    if found is None:
        reason = NO_EXAMPLE_BATCH.format(name=bench.name)
        report["skipped"].update({level: reason for level in ("operators", "roofline", "memory", "communication")})
    else:
        say(f"operators: {options.steps} steps at batch {batch} on {device}")
        ops = operators.profile_operators(workload(batch)(), steps=options.steps)
        report["operators"] = dataclasses.asdict(ops)
        say(f"roofline: this machine's GEMM ({cfg.loop.precision}) and streaming peaks")
        peaks = roofline.machine_peaks(device, training_dtype(cfg))
        step_flops_per_s = found.training_flops_per_sample * batch / ops.step_seconds if ops.step_seconds else 0.0
        point = (found.flop_per_memory_byte, step_flops_per_s)
        report["roofline"] = dataclasses.asdict(roofline.place_operators(peaks, ops, point))
        sizes = options.memory_batches or tuple(sorted({max(1, batch // 2), batch}))
        say(f"memory: the step's peak at batch sizes {', '.join(map(str, sizes))}")
        report["memory"] = dataclasses.asdict(memory.memory_breakdown(lambda b: workload(b)(), sizes))
        if options.ranks < 2:
            report["skipped"]["communication"] = "--ranks 1: no group to all-reduce in"
        elif kind == "cuda" and torch.cuda.device_count() < options.ranks:
            report["skipped"]["communication"] = (
                f"{options.ranks} ranks need {options.ranks} GPUs; this machine has {torch.cuda.device_count()}"
            )
        else:
            backend = "nccl" if kind == "cuda" else "gloo"
            say(f"communication: {options.ranks} ranks ({backend}), {options.steps} steps")
            comm = communication.measure_communication(
                workload(batch), steps=options.steps, world_size=options.ranks, backend=backend
            )
            report["communication"] = dataclasses.asdict(comm)
    say(f"I/O: {options.io_samples} samples through {bench.name}'s own loader")
    # The loader at batch 1 (its sample count check then holds for a few generated samples), and
    # torch's where the benchmark also has DALI's: the level times one sample at a time.
    io_overrides = [*options.overrides, "loop.global_batch_size=1"]
    if hasattr(getattr(cfg, "data", None), "loader"):
        io_overrides.append("data.loader=torch")
    io_cfg = load_config(bench.config_class, bench.config_path(options.config), io_overrides)
    with _dataset(options, bench, io_cfg) as data_dir:
        loaders = bench.build_data(io_cfg, data_dir, single_process_context(torch.device("cpu")), 0)
        dataset = getattr(loaders.train, "dataset", None)
        if dataset is None or not hasattr(dataset, "sample_files"):
            report["skipped"]["io"] = f"{bench.name}'s loader ({loaders.loader}) has no map-style dataset to time"
        else:
            samples = min(options.io_samples, len(dataset))
            report["io"] = dataclasses.asdict(io_level.measure_io(dataset, samples=samples, seed=0, evict=True))


class _dataset:
    """The I/O level's dataset: --data as it is, else a few generated samples in a folder of our
    own beside --out (its name is ours; removed after, and only it)."""

    def __init__(self, options: CharacterizeOptions, bench: registry.Benchmark, cfg: Any) -> None:
        self.options, self.bench, self.cfg = options, bench, cfg
        self.made: Path | None = None

    def __enter__(self) -> Path:
        if self.options.data is not None:
            if not self.options.data.is_dir():
                raise ConfigError(f"--data {self.options.data}: no such folder; pass the dataset's folder")
            self.bench.validate_dataset(self.cfg, self.options.data)
            return self.options.data
        self.options.out.mkdir(parents=True, exist_ok=True)
        count = self.options.io_samples + 1  # the level reads one sample outside its draw first
        _check_room(self.options.out, self.bench, self.cfg, count)
        self.made = Path(tempfile.mkdtemp(prefix=".characterize-data-", dir=self.options.out))
        self.bench.generate(self.cfg, self.made, num_samples=count, seed=0)
        return self.made

    def __exit__(self, *exc: object) -> None:
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)


def _check_room(out: Path, bench: registry.Benchmark, cfg: Any, count: int) -> None:
    """Refuse before writing when the generated samples (and their validation split) would not
    fit beside --out with room to spare."""
    if bench.sample_bytes is None:
        return
    need = 2 * count * bench.sample_bytes(cfg)  # train and eval splits, with room for headers
    free = shutil.disk_usage(out).free
    if need > free // 2:
        raise ConfigError(
            f"--out {out}: the I/O level would generate {need / 1e9:.1f} GB of samples there and "
            f"{free / 1e9:.1f} GB are free; pass --data with an existing dataset or fewer --io-samples"
        )


MEMORY_SHARE = 0.8
"""Of the device's memory, what the timed levels' estimate may take before they are refused."""


def _check_memory(found: Any, batch: int, ranks: int, device: torch.device) -> None:
    """Refuse, before building anything, a batch whose step would not fit: a rough bound from the
    analytic level (activations and input twice, for their gradients; weights, gradients and
    optimizer state), for every rank that shares the device's memory."""
    per_rank = (
        2 * batch * (found.activation_bytes_per_sample + found.input_bytes_per_sample)
        + 2 * found.parameter_bytes
        + found.optimizer_state_bytes
    )
    if device.type == "cuda":
        memory: int | None = torch.cuda.mem_get_info(device)[1]
    else:
        from mlhpc.campaign.machine import memory_bytes

        memory = memory_bytes()
    if memory is not None and per_rank * ranks > MEMORY_SHARE * memory:
        raise ConfigError(
            f"--batch-size {batch}: a step needs about {per_rank * ranks / 2**30:.1f} GiB on {device.type} "
            f"({ranks} rank(s)) and it has {memory / 2**30:.1f} GiB; pass a smaller --batch-size "
            "(and --memory-batches), or --analytic"
        )


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this torch sees no CUDA device; use --device cpu")
    if choice not in ("cpu", "cuda"):
        raise ConfigError(f"--device {choice!r}: use auto, cpu or cuda")
    return torch.device(choice)


def system_facts(device: torch.device) -> dict[str, Any]:
    """What the page's reader needs to know about where the figures came from."""
    from mlhpc.system_desc import cpu_model

    facts: dict[str, Any] = {
        "host": platform.node(),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "mlhpc": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return facts


def write(report: dict[str, Any], out: Path) -> Path:
    """characterize.json (under a temporary name first) and the page beside it; returns the page."""
    from mlhpc.characterize.page import characterize_page

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / JSON_NAME, report)
    return atomic_write_text(out / PAGE_NAME, characterize_page(report))


