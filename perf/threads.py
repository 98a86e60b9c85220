"""One CosmoFlow mini seed, idle and with the machine's cores kept busy, under three thread
settings, in one run.

    python perf/threads.py [--repeats 1] [--busy torch|spin] [--out DIR]

Settings, each a whole `mlhpc run cosmoflow --config mini --seeds 1` process on one dataset:
- `torch`: torch's own defaults, one thread per core each spinning ~300,000 iterations at every
  barrier (what mlhpc did before common/cluster/threads; `MLHPC_THREADS=torch GOMP_SPINCOUNT=300000`);
- `omp1`: `OMP_NUM_THREADS=1`, the workaround a user would reach for;
- `mlhpc`: nothing set: mlhpc's choice (threads from the CPUs it may use, a short spin).

`--busy torch` keeps every core busy with another process doing float matrix products with
torch's default threads (a neighbour's job on a shared node); `--busy spin` with one pure-Python
busy loop per core. Each repeat draws a new seed at random and runs the settings in a shuffled
order. Printed per case: wall seconds and training samples/s (from the run's breakdown); the last
lines are each setting's ratio against `torch`, idle and busy (above 1: faster).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SETTINGS = {
    "torch": {"MLHPC_THREADS": "torch", "GOMP_SPINCOUNT": "300000", "KMP_BLOCKTIME": "200"},
    "omp1": {"OMP_NUM_THREADS": "1"},
    "mlhpc": {},
}
OURS = ("OMP_NUM_THREADS", "MLHPC_THREADS", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_WAIT_POLICY")
MLHPC = [sys.executable, "-m", "mlhpc"]

BUSY_TORCH = """
import time, torch
a = torch.randn(384, 384)
while True:
    for _ in range(20):
        a = torch.tanh(a @ a)
"""
BUSY_SPIN = "while True: pass"


@contextmanager
def busy(kind: str) -> Iterator[None]:
    """Keep every core busy for the duration (none for kind 'idle')."""
    if kind == "idle":
        yield
        return
    cores = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k not in OURS}  # a neighbour with torch's defaults
    count = 1 if kind == "torch" else cores
    code = BUSY_TORCH if kind == "torch" else BUSY_SPIN
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(count)]
    try:
        time.sleep(2)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def one_seed(setting: str, data: Path, out: Path, seed: int) -> tuple[float, float]:
    """Wall seconds and training samples/s of one seed under `setting`."""
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env.update(SETTINGS[setting])
    command = [*MLHPC, "run", "cosmoflow", "--config", "mini", "--seeds", "1", "--first-seed", str(seed)]
    command += ["--data", str(data), "--out", str(out), "--no-check"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"perf/threads.py: {setting} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    breakdown = json.loads(next(out.glob("breakdown/**/result_0.json")).read_text())
    phases = ("data_wait", "forward", "backward", "optimizer", "communication")
    seconds = sum(breakdown["seconds"].get(phase, 0.0) for phase in phases)
    return wall, breakdown["train_samples_seen"] / max(seconds, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--busy", choices=("torch", "spin"), default="torch")
    parser.add_argument("--out", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mlhpc-perf-threads-", dir=args.out))
    data = scratch / "data"
    subprocess.run([*MLHPC, "generate", "cosmoflow", "--config", "mini", "--out", str(data)], check=True)
    walls: dict[tuple[str, str], list[float]] = {}
    rates: dict[tuple[str, str], list[float]] = {}
    print(f"{'machine':6} {'setting':6} {'seed':>10} {'wall s':>8} {'samples/s':>10}", flush=True)
    for repeat in range(args.repeats):
        seed = random.randrange(1, 2**31)
        for load in ("idle", "busy"):
            order = list(SETTINGS)
            random.shuffle(order)
            with busy("idle" if load == "idle" else args.busy):
                for setting in order:
                    wall, rate = one_seed(setting, data, scratch / f"{load}-{setting}-{repeat}", seed)
                    walls.setdefault((load, setting), []).append(wall)
                    rates.setdefault((load, setting), []).append(rate)
                    print(f"{load:6} {setting:6} {seed:>10} {wall:8.1f} {rate:10.0f}", flush=True)
    print(f"busy: every core kept busy by {'a torch matmul loop' if args.busy == 'torch' else 'spin loops'}")
    for load in ("idle", "busy"):
        base = statistics.median(walls[(load, "torch")])
        for setting in ("omp1", "mlhpc"):
            mine = statistics.median(walls[(load, setting)])
            print(f"{load}: {setting} vs torch's default: wall x{base / mine:.2f} ({mine:.1f} s against {base:.1f} s)")


if __name__ == "__main__":
    main()
