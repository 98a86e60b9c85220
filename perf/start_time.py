"""How long the staging commands take to start, against `python -c pass` on the same machine.

One run, interleaved: each round runs every command once (in a rotated order, so that none always
goes first), and the figures are medians and ranges over the rounds; a first round warms the file
cache and is not counted. The commands: `python -c pass`, `mlhpc stage --help`, `mlhpc manifest
--help`, `mlhpc verify --help`, and real runs on a tiny folder made in a temporary directory (and
removed): `mlhpc stage SRC DEST` into a fresh DEST each round, `mlhpc manifest` of a copy of SRC
and `mlhpc verify` of a staged copy. Each figure is the wall time of the whole process.

    python perf/start_time.py                       # the mlhpc beside this python
    python perf/start_time.py --rounds 30 --mlhpc /work/main/.venv/bin/mlhpc --mlhpc .venv/bin/mlhpc

Several --mlhpc are measured in the same rounds (before and after a change, side by side); each
one's ratio is to the `python -c pass` of the python beside it. Where PYTHONDONTWRITEBYTECODE is
set, compile the sources first (`python -m compileall -q mlhpc common staging`), or every run
also compiles them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MLHPC_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def quiet_env() -> dict[str, str]:
    """This environment without a launcher's variables: a staging run here is one rank."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES
    }


def make_folder(path: Path, files: int = 8, size: int = 4096) -> Path:
    """A tiny dataset: `files` files of `size` bytes, one in a subfolder."""
    (path / "sub").mkdir(parents=True)
    for i in range(files):
        where = path / "sub" if i == 0 else path
        (where / f"f{i}.bin").write_bytes(bytes([i]) * size)
    return path


def commands(mlhpc: Path, scratch: Path) -> dict[str, list[str]]:
    """The commands measured for one mlhpc (its own python for `-c pass`), by label."""
    python = mlhpc.parent / "python"
    src = make_folder(scratch / "src")
    hashed = make_folder(scratch / "hashed")
    staged = scratch / "staged"
    subprocess.run(
        [str(mlhpc), "stage", str(src), str(staged)], check=True, capture_output=True, env=quiet_env()
    )
    return {
        "python -c pass": [str(python), "-c", "pass"],
        "mlhpc stage --help": [str(mlhpc), "stage", "--help"],
        "mlhpc manifest --help": [str(mlhpc), "manifest", "--help"],
        "mlhpc verify --help": [str(mlhpc), "verify", "--help"],
        "mlhpc stage SRC DEST": [str(mlhpc), "stage", str(src), str(scratch / "dest")],
        "mlhpc manifest SRC": [str(mlhpc), "manifest", str(hashed)],
        "mlhpc verify DEST": [str(mlhpc), "verify", str(staged)],
    }


def timed(command: list[str], env: dict[str, str]) -> float:
    """The wall time of one run of `command`, in seconds; a failure stops the measurement."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return seconds


def measure(mlhpcs: list[Path], rounds: int, scratch: Path) -> dict[Path, dict[str, list[float]]]:
    """Each mlhpc's commands, `rounds` times each, interleaved: {mlhpc: {label: [seconds]}}."""
    env = quiet_env()
    jobs = []
    for i, mlhpc in enumerate(mlhpcs):
        jobs += [(mlhpc, label, command) for label, command in commands(mlhpc, scratch / str(i)).items()]
    times: dict[Path, dict[str, list[float]]] = {m: {} for m in mlhpcs}
    for mlhpc, label, _ in jobs:  # printed in the commands' order
        times[mlhpc][label] = []
    for turn in range(rounds + 1):  # round 0 warms the caches and is dropped
        shift = turn % len(jobs)
        for mlhpc, label, command in jobs[shift:] + jobs[:shift]:
            seconds = timed(command, env)
            if label == "mlhpc stage SRC DEST":  # the next round stages into a fresh folder again
                shutil.rmtree(command[-1])
            if turn:
                times[mlhpc][label].append(seconds)
    return times


def report(times: dict[Path, dict[str, list[float]]], rounds: int) -> str:
    lines = [
        f"{rounds} rounds, interleaved; wall time of each process in ms: median (min-max), x python -c pass"
    ]
    for mlhpc, by_label in times.items():
        lines.append(f"\n{mlhpc}")
        base = statistics.median(by_label["python -c pass"])
        for label, values in by_label.items():
            median = statistics.median(values)
            lines.append(
                f"  {label:<24}{median * 1e3:8.1f}  ({min(values) * 1e3:6.1f}-{max(values) * 1e3:6.1f})"
                f"  x{median / base:.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds (20)")
    parser.add_argument(
        "--mlhpc",
        type=Path,
        action="append",
        help="an mlhpc script to measure, its python beside it (repeatable; default: beside this python)",
    )
    args = parser.parse_args(argv)
    mlhpcs = [m.absolute() for m in args.mlhpc or [Path(sys.executable).parent / "mlhpc"]]
    with tempfile.TemporaryDirectory(prefix="mlhpc_start_") as scratch:
        times = measure(mlhpcs, args.rounds, Path(scratch))
    print(report(times, args.rounds))
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(
            "\nnote: PYTHONDONTWRITEBYTECODE is set; without compiled sources the figures include compiling"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
