"""mlhpc against the MLPerf HPC reference implementation on this machine: CosmoFlow.

Runs the mlcommons/hpc CosmoFlow reference (TensorFlow/Keras, from the user's own checkout of
https://github.com/mlcommons/hpc, unchanged) and `mlhpc run cosmoflow --config full`, one after
the other and interleaved (R M R M ...), on the same generated samples (mlhpc's generator, the
same int16 cubes written again as the reference's TFRecords), each with the same number of CPU
threads, and prints training samples per second and per CPU-second and mlhpc's ratio to the
reference.

    python perf/peer_speed.py --hpc ~/src/hpc --tf-python ~/tf/bin/python --threads 1 2

What is measured, the same way on both sides: each run trains `--epochs` epochs of
`--train-samples` samples at batch 4 (then validates `--eval-samples`); the first epoch (graph
tracing, first touches) is left out. A training span runs from an epoch's MLLOG `epoch_start` to
its `eval_start`, read from each side's own MLLOG file; its CPU-seconds are the run's process
tree's (every thread, loader workers included), sampled from /proc twice a second and
interpolated at those instants.

The reference needs TensorFlow 2 with the legacy Keras 2 (`pip install tensorflow-cpu tf_keras
pandas pyyaml mlperf-logging` in the interpreter given as --tf-python). Its `train.py` imports
Horovod and wandb at the top but uses neither in a one-process run without --wandb: this script
gives it empty stand-ins for both (Horovod's "not initialized" answer for rank()), so that the
checkout stays as it is. TensorFlow's oneDNN path is switched on (TF_ENABLE_ONEDNN_OPTS=1):
TensorFlow leaves it off on CPUs without AVX-512, where its default is several times slower.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mlhpc.submission_checker.logparse import TOKEN, decode_mllog

REPO = Path(__file__).resolve().parents[1]
BATCH = 4
SAMPLE_BYTES = 128**3 * 4 * 2  # one full-size int16 cube

# Run by --tf-python: mlhpc's .npy samples as the reference's TFRecords (x: the int16 bytes of the
# (128, 128, 128, 4) cube, y: the 4 float targets; see data/cosmo.py::_parse_data there).
TO_TFRECORD = """
import sys
from pathlib import Path
import numpy as np
import tensorflow as tf
source, dest = Path(sys.argv[1]), Path(sys.argv[2])
for split in ("train", "validation"):
    (dest / split).mkdir(parents=True, exist_ok=True)
    names = (source / split / "files_data.lst").read_text().split()
    labels = (source / split / "files_label.lst").read_text().split()
    for i, (name, label) in enumerate(zip(names, labels)):
        x = np.load(source / split / name)
        y = np.load(source / split / label).astype(np.float32)
        example = tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.astype(np.int16).tobytes()])),
            "y": tf.train.Feature(float_list=tf.train.FloatList(value=y.tolist())),
        }))
        with tf.io.TFRecordWriter(str(dest / split / f"sample_{i:06d}.tfrecord")) as writer:
            writer.write(example.SerializeToString())
"""

# Run by --tf-python in the checkout's cosmoflow/ folder: train.py as its README runs it, with
# stand-ins for the two imports a one-process run never calls.
RUN_REFERENCE = """
import os, runpy, sys, types
def not_initialized(*args, **kwargs):
    raise ValueError("Horovod has not been initialized; use hvd.init().")
hvd = types.ModuleType("horovod.tensorflow.keras")
for name in ("init", "rank", "size", "local_rank", "local_size", "allreduce"):
    setattr(hvd, name, not_initialized)
for name in ("horovod", "horovod.tensorflow"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["horovod.tensorflow.keras"] = hvd
sys.modules["wandb"] = types.ModuleType("wandb")
sys.path.insert(0, os.getcwd())
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@dataclass(frozen=True)
class Span:
    """One epoch's training: wall seconds, CPU-seconds of the whole process tree, samples."""

    wall_s: float
    cpu_s: float
    samples: int


def tree_cpu_seconds(root: int) -> float:
    """CPU-seconds of `root` and every live descendant, plus its reaped children's."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            stats[int(entry.name)] = text[text.rindex(")") + 2 :].split()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        fields = stats.get(pid)
        if fields is None:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if pid == root:
            total += int(fields[13]) + int(fields[14])  # cutime, cstime: reaped workers
        todo += children.get(pid, [])
    return total / ticks


def run_sampled(
    command: list[str], cwd: Path, env: dict[str, str], log: Path, ok: tuple[int, ...] = (0,)
) -> list[tuple[float, float]]:
    """Run a command to the end, its output to `log`; (unix time, tree CPU-seconds) samples."""
    samples: list[tuple[float, float]] = []
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                with contextlib.suppress(OSError, ValueError):
                    samples.append((time.time(), tree_cpu_seconds(proc.pid)))
                done.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
    if code not in ok:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"{' '.join(command[:4])} ... exited {code}; the end of {log}:\n{tail}")
    return samples


def cpu_at(samples: list[tuple[float, float]], when: float) -> float:
    """The process tree's CPU-seconds at unix time `when`, interpolated between samples."""
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if t0 <= when <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
    raise SystemExit(f"no CPU sample around {when}: the run ended before its log did")


def mllog_events(path: Path) -> list[dict]:
    """The log's MLLOG records, decoded and checked by the submission checker's own decoder."""
    events = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if TOKEN in line:
            try:
                events.append(decode_mllog(line))
            except ValueError as e:
                raise SystemExit(f"{path}, line {number}: {e}") from None
    return events


def training_spans(log: Path, samples: list[tuple[float, float]], per_epoch: int) -> list[Span]:
    """Each epoch's epoch_start -> eval_start, but the first."""
    starts, evals = [], []
    for event in mllog_events(log):
        if event["key"] == "epoch_start":
            starts.append(event["time_ms"] / 1000)
        elif event["key"] == "eval_start":
            evals.append(event["time_ms"] / 1000)
    spans = []
    for begin, end in list(zip(starts, evals, strict=False))[1:]:
        spans.append(Span(end - begin, cpu_at(samples, end) - cpu_at(samples, begin), per_epoch))
    if not spans:
        raise SystemExit(f"{log}: fewer than two epochs logged; use --epochs 3 or more")
    return spans


def check_space(work: Path, needed: int) -> None:
    free = shutil.disk_usage(work).free
    if free < 2 * needed:
        raise SystemExit(f"{work}: {free / 1e9:.1f} GB free, {2 * needed / 1e9:.1f} GB wanted; use --work elsewhere")


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    npy, tfrecord = work / "npy", work / "tfrecord"
    if not (npy / "mlhpc_manifest.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "mlhpc", "generate", "cosmoflow", "--config", "full", "--out", str(npy),
             "--seed", "1", *sample_counts(args)],
            check=True,
        )
    if not (tfrecord / "validation").is_dir():
        subprocess.run([args.tf_python, "-c", TO_TFRECORD, str(npy), str(tfrecord)], check=True)
    return npy, tfrecord


def sample_counts(args: argparse.Namespace) -> list[str]:
    return [f"data.num_train_samples={args.train_samples}", f"data.num_eval_samples={args.eval_samples}"]


def threads_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


def run_reference(args: argparse.Namespace, tfrecord: Path, threads: int, out: Path) -> list[Span]:
    import yaml  # mlhpc's own dependency (pyyaml), for the reference's config

    checkout = Path(args.hpc).resolve() / "cosmoflow"
    config = yaml.safe_load((checkout / "configs" / "cosmo.yaml").read_text())
    config["data"]["compression"] = None  # the samples are written uncompressed, as mlhpc reads them
    out.mkdir(parents=True)
    (out / "cosmo.yaml").write_text(yaml.safe_dump(config))
    env = threads_env(threads)
    env.update(TF_USE_LEGACY_KERAS="1", TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    command = [
        args.tf_python, "-c", RUN_REFERENCE, str(out / "cosmo.yaml"), "--output-dir", str(out / "output"),
        "--data-dir", str(tfrecord), "--n-train", str(args.train_samples), "--n-valid", str(args.eval_samples),
        "--batch-size", str(BATCH), "--n-epochs", str(args.epochs), "--intra-threads", str(threads),
        "--inter-threads", "1", "--mlperf",
    ]  # fmt: skip
    samples = run_sampled(command, checkout, env, out / "output.log")
    return training_spans(out / "output" / "mlperf.log", samples, args.train_samples)


def run_mlhpc(args: argparse.Namespace, npy: Path, threads: int, out: Path) -> list[Span]:
    out.mkdir(parents=True)
    env = threads_env(threads)
    command = [
        sys.executable, "-m", "mlhpc", "run", "cosmoflow", "--config", "full", "--data", str(npy),
        "--out", str(out / "submission"), "--local-dir", str(out / "local"), "--staging", "before",
        "--seeds", "1", "--first-seed", "1", "--division", "open", "--no-check", "--device", "cpu",
        f"loop.global_batch_size={BATCH}", f"loop.max_epochs={args.epochs}", "loop.target=0.0001",
        *sample_counts(args), *args.mlhpc_set,
    ]  # fmt: skip
    # It exits 2 when the seed does not reach its target: here the target is out of reach on purpose.
    samples = run_sampled(command, REPO, env, out / "output.log", ok=(0, 2))
    (log,) = (out / "submission").glob("mlhpc/results/*/strong/cosmoflow/result_0.txt")
    return training_spans(log, samples, args.train_samples)


def per_second(spans: list[Span]) -> tuple[float, float]:
    """Samples per second and per CPU-second over all spans of one run."""
    samples = sum(s.samples for s in spans)
    return samples / sum(s.wall_s for s in spans), samples / sum(s.cpu_s for s in spans)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hpc", required=True, help="a checkout of https://github.com/mlcommons/hpc")
    parser.add_argument("--tf-python", required=True, help="a Python with tensorflow, tf_keras, pandas, pyyaml")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="CPU threads of each side")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per thread count")
    parser.add_argument("--train-samples", type=int, default=8, help="samples per epoch (a multiple of 4)")
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is left out")
    parser.add_argument(
        "--mlhpc-set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for mlhpc's side"
    )
    parser.add_argument("--work", type=Path, default=None, help="where the samples and runs go")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args()
    if not (Path(args.hpc) / "cosmoflow" / "train.py").is_file():
        raise SystemExit(f"--hpc {args.hpc}: no cosmoflow/train.py there; give a checkout of mlcommons/hpc")
    if args.train_samples % BATCH or args.eval_samples % BATCH:
        raise SystemExit(f"--train-samples and --eval-samples: multiples of {BATCH}, the batch size")
    work = Path(args.work or tempfile.mkdtemp(prefix="mlhpc-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    runs_bytes = (args.train_samples + args.eval_samples) * SAMPLE_BYTES
    check_space(work, 3 * runs_bytes * (1 + len(args.threads) * args.repeats))  # npy, tfrecord, staged
    npy, tfrecord = prepare(args, work)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    settings = " ".join(args.mlhpc_set) or "the full config as it is"
    print(f"mlhpc {commit.stdout.strip()} ({settings}), reference {args.hpc}, {os.cpu_count()} CPUs, work {work}")
    figures: list[dict] = []
    for threads in args.threads:
        for repeat in range(args.repeats):
            for side, run in (("reference", run_reference), ("mlhpc", run_mlhpc)):
                data = tfrecord if side == "reference" else npy
                out = work / f"t{threads}-{repeat}-{side}"
                shutil.rmtree(out, ignore_errors=True)
                spans = run(args, data, threads, out)
                shutil.rmtree(out / "local", ignore_errors=True)  # mlhpc's staged copy
                wall, cpu = per_second(spans)
                figures.append({"threads": threads, "repeat": repeat, "side": side, "samples_per_s": wall,
                                "samples_per_cpu_s": cpu, "spans": [vars(s) for s in spans]})  # fmt: skip
                print(f"threads {threads} repeat {repeat} {side}: {wall:.4f} samples/s, {cpu:.4f} per CPU-s")
    print("\nbenchmark | threads | side | samples/s | samples/CPU-s | mlhpc/reference per s | per CPU-s")
    for threads in args.threads:
        mine = [f for f in figures if f["threads"] == threads]
        ref = [f for f in mine if f["side"] == "reference"]
        own = [f for f in mine if f["side"] == "mlhpc"]
        ratio_s = [m["samples_per_s"] / r["samples_per_s"] for m, r in zip(own, ref, strict=True)]
        ratio_cpu = [m["samples_per_cpu_s"] / r["samples_per_cpu_s"] for m, r in zip(own, ref, strict=True)]
        for side, rows in (("reference", ref), ("mlhpc", own)):
            wall = spread([f["samples_per_s"] for f in rows])
            cpu = spread([f["samples_per_cpu_s"] for f in rows])
            ratios = f"{spread(ratio_s)} | {spread(ratio_cpu)}" if side == "mlhpc" else "- | -"
            print(f"cosmoflow | {threads} | {side} | {wall} | {cpu} | {ratios}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(textwrap.dedent(f"""
        ratios: each mlhpc run against the reference run just before it; median (min-max) of
        {args.repeats}. Samples: {work} (remove it when done).""").strip())


if __name__ == "__main__":
    main()
