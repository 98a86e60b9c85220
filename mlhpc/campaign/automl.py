"""`mlhpc run` of an AutoML workload (AIPerf): the run on this machine's ranks (one node; `--instances K` makes K one-rank
nodes of it), each rank of an `srun`/`torchrun` launch as one rank of its node, or (--slurm) one
batch job whose srun step runs every node (in --container's image where one is given), followed
by `mlhpc check` of the run.

Torch is imported only where a rank trains: the login node submits without it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlhpc.benchmarks.aiperf.experiment import NODE_ENV, RUN_DIR, RUN_FILE
from mlhpc.common.errors import ConfigError

if TYPE_CHECKING:
    from mlhpc.campaign.prepare import Prepared
    from mlhpc.campaign.slurm_graph import SlurmResources

DATA_WAIT_S = 3600.0
SCORE_GRACE_S = 3.0
"""After the deadline, before node 0 scores: a last epoch line written just before it lands."""


def run(args: argparse.Namespace, prepared: Prepared) -> int:
    """The `mlhpc run` handler for AIPerf (commands/run.py hands it over once the options and the
    config are checked)."""
    opts = prepared.opts
    _refuse_what_does_not_apply(args, opts)
    seed = opts.first_seed if opts.first_seed is not None else random.SystemRandom().randrange(2**31)
    if args.slurm:
        return _submit(args, prepared, seed)
    if args.dry_run:
        return _dry_run(prepared, args.json)
    from mlhpc.common.cluster.launch import detect_launch

    launch = detect_launch()
    run_dir = opts.out / RUN_DIR
    if opts.instances > 1 and launch.world_size == 1 and NODE_ENV not in os.environ:
        status = _run_instances(args, opts.instances, seed)
    else:
        status = _work_here(prepared, seed, run_dir)
        if launch.rank != 0 or status != 0:
            return status
    if opts.instances > 1 and NODE_ENV in os.environ:
        return 0  # one of --instances' nodes: the parent scores
    if args.no_check or status != 0:
        return status
    time.sleep(SCORE_GRACE_S)
    from mlhpc.benchmarks.aiperf.scoring import check_run

    return check_run(run_dir)


def _refuse_what_does_not_apply(args: argparse.Namespace, opts: Any) -> None:
    """The options of a time-to-train campaign that mean nothing to a search that runs for a duration."""
    refused = {
        "--seeds": opts.num_seeds != 1,
        "--resume": opts.resume,
        "--index": opts.index is not None,
        "--power": opts.power,
        "--seed-file": getattr(args, "seed_file", None) is not None,
        "--staging": opts.staging != "inside",
        "--clear-cache": opts.clear_cache,
    }
    for flag, given in refused.items():
        if given:
            raise ConfigError(
                f"{flag} does not apply to aiperf (one search for search.duration_minutes, its trials "
                f"reading --data on the shared file system); drop {flag}"
            )


def _dry_run(prepared: Prepared, json_path: Path | None) -> int:
    """The seed's per-image operations as AIPerf counts them, and what the run would do."""
    from mlhpc.benchmarks.aiperf.ops_count import ops_per_image
    from mlhpc.benchmarks.aiperf.seed import resnet

    cfg = prepared.resolved.cfg
    size = cfg.data.image_size
    graph = resnet((size, size, 3), cfg.data.classes, blocks=tuple(cfg.seed.blocks), width=cfg.seed.width,
                   stem=cfg.seed.stem)
    kernel = cfg.search.kernel_sizes[0]
    ops = ops_per_image(graph.to_json(), kernel)
    print(f"aiperf --config {prepared.opts.config}: a search of {cfg.search.duration_minutes:g} min from a "
          f"{len(graph.layers)}-layer seed at {size}x{size}, {cfg.data.classes} classes")
    print(f"seed ops per image (AIPerf's count): eval {ops.eval:.6g}, train {ops.train:.6g}")
    print(f"run folder: {prepared.opts.out / RUN_DIR}")
    if json_path is not None:
        from mlhpc.common.safeio.fileio import atomic_write_json

        atomic_write_json(json_path, {
            "benchmark": "aiperf",
            "config": prepared.opts.config,
            "ops_per_image": {"eval": ops.eval, "train": ops.train, "kernel_size": kernel},
            "seed_layers": len(graph.layers),
            "image_size": size,
            "classes": cfg.data.classes,
            "duration_minutes": cfg.search.duration_minutes,
        })
    return 0


def _work_here(prepared: Prepared, seed: int, run_dir: Path) -> int:
    from mlhpc.benchmarks.aiperf.worker import work

    data = prepared.opts.data or _ensure_data(prepared, seed)
    trials = work(run_dir, prepared.resolved.cfg, data, seed, device=prepared.opts.device)
    if trials:
        print(f"this node ran {trials} trials")
    return 0


def _ensure_data(prepared: Prepared, seed: int) -> Path:
    """The config's synthetic dataset (generated once into --out/datasets, reused after); the
    nodes that find another generating it wait for it."""
    from mlhpc.common.contract import registry
    from mlhpc.generation import generate_dataset

    folder = prepared.generated_dir
    assert folder is not None
    bench = registry.get("aiperf")
    cfg = prepared.resolved.cfg
    generate_dataset(
        folder,
        lambda out: bench.generate(cfg, out, seed=seed),
        reuse_complete=True,
        not_ours_fix=f"pass --data {folder} to search on them, or move it away",
        size=prepared.size,
        wait_s=DATA_WAIT_S,
    )
    return folder


def _run_instances(args: argparse.Namespace, count: int, seed: int) -> int:
    """--instances K on one machine: K one-rank nodes, each a process of its own."""
    words = [a for a in args.argv]
    if "--first-seed" not in words:
        words += ["--first-seed", str(seed)]
    procs = []
    # the machine's cores shared out: K nodes of the default thread count each would oversubscribe it
    threads = str(max(1, len(os.sched_getaffinity(0)) // count))
    for node in range(count):
        env = {**os.environ, NODE_ENV: f"{node}/{count}", "OMP_NUM_THREADS": threads}
        procs.append(subprocess.Popen([sys.executable, "-m", "mlhpc", *words], env=env))
    codes = [p.wait() for p in procs]
    bad = [c for c in codes if c != 0]
    if len(bad) == len(codes):
        return bad[0]
    if bad:
        print(f"{len(bad)} of {count} nodes failed (exit {bad}); the others' trials count", file=sys.stderr)
    return 0


def _submit(args: argparse.Namespace, prepared: Prepared, seed: int) -> int:
    """--slurm: one job of --slurm-nodes nodes; its srun step runs every node's ranks, then the
    batch script scores the run with mlhpc check."""
    from mlhpc.campaign.job_strings import script_path, script_words
    from mlhpc.campaign.slurm import resources_from_args, sbatch_job_id
    from mlhpc.campaign.slurm_graph import directives
    from mlhpc.common.safeio.fileio import atomic_write_text

    opts = prepared.opts
    resources = resources_from_args(args)
    out = script_path("--out", opts.out.resolve())
    data = None if opts.data is None else script_path("--data", opts.data.resolve())
    if (out / RUN_DIR / RUN_FILE).exists():  # the job would refuse it: say so before queueing
        raise ConfigError(f"--out {out} already holds an AIPerf run; pass a new --out for a new run")
    folder = out / "slurm"
    words = ["run", "aiperf", "--config", str(Path(opts.config).resolve()) if Path(opts.config).suffix else opts.config,
             "--out", str(out), "--first-seed", str(seed), "--no-check", "--device", opts.device]
    if data is not None:
        words += ["--data", str(data)]
    words += list(opts.overrides)
    script_words("the run's options", words)
    node_mlhpc, check_mlhpc = _mlhpc_in_job(resources, (out, *([data] if data else [])))
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives(resources, job_name="mlhpc-aiperf", output=folder / "aiperf-%j.out")),
        "# mlhpc run aiperf: every node searches until the run's duration is over, then the run is scored",
        # a node lost mid-run takes its own trial alone: the step and the job go on without it
        f"srun --kill-on-bad-exit=0 --no-kill {shlex.join([*node_mlhpc, *words])}",
        f"{shlex.join([*check_mlhpc, 'check', str(out)])} --json {shlex.quote(str(folder / 'check-'))}\"$SLURM_JOB_ID\".json",
    ]
    script = "\n".join(lines) + "\n"
    if args.dry_run:
        print(script, end="")
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError("sbatch is not on PATH; submit from a Slurm login node, or pass --dry-run")
    folder.mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(folder / "aiperf.sbatch", script)
    job = sbatch_job_id([sbatch, "--parsable", str(path)])
    atomic_write_text(folder / "jobs.json", json.dumps({"aiperf": job, "seed": seed}))
    print(f"aiperf job {job}: {resources.nodes} nodes x {resources.ntasks_per_node} ranks, seed {seed}; "
          f"output in {folder}")
    return 0


def _mlhpc_in_job(resources: SlurmResources, folders: tuple[Path, ...]) -> tuple[list[str], list[str]]:
    """How the job calls mlhpc: for every node's ranks (after `srun [options]`), and for the check
    (a whole command). Without --container, the submitting Python's; with it, the image's, with
    --out and --data bound at their own paths (a run's trials read --data on the shared file system:
    no node-local folder) and the check in one task of srun without GPUs (pyxis starts a container
    only under srun)."""
    if resources.container is None:
        python = [sys.executable, "-m", "mlhpc"]
        return python, python
    from dataclasses import replace

    from mlhpc.campaign.containers import outermost

    container = replace(resources.container, binds=tuple(outermost(list(folders))))
    node = [*container.words(gpus=resources.gpus), "mlhpc"]
    return node, ["srun", "--ntasks=1", *container.words(gpus=False), "mlhpc"]
