"""Submission entries built from the trimmed real entries in tests/data, with power logs beside them."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"


HOREKA = "horeka_gpu_n512_pytorch1.13"


DEEPCAM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "results" / HOREKA / "strong" / "deepcam"


SYSTEM = DATA / "hpc_v2.0_helmholtzai" / "HelmholtzAI" / "systems" / f"{HOREKA}.json"


def _run_window(result: Path) -> tuple[float, float]:
    start = stop = None
    for text in result.read_text(encoding="latin-1").splitlines():
        if ":::MLLOG " not in text:
            continue
        record = json.loads(text.split(":::MLLOG ", 1)[1])
        if record["key"] == "run_start" and start is None:
            start = record["time_ms"]
        if record["key"] == "run_stop" and stop is None:
            stop = record["time_ms"]
    assert start is not None and stop is not None
    return start, stop


def write_power_log(
    path: Path,
    start: float,
    stop: float,
    rng: random.Random,
    *,
    switch: bool = False,
    period_ms: float = 500.0,
    eff: float | None = None,
    stop_line: bool = True,
) -> None:
    """One node (or switch) log with the official logger, readings every `period_ms`."""
    import logging

    from mlperf_logging.mllog import constants
    from mlperf_logging.mllog.mllog import MLLogger

    path.parent.mkdir(parents=True, exist_ok=True)
    sink = logging.getLogger(f"mlhpc-test-power.{path}")
    sink.propagate, sink.handlers = False, []
    sink.setLevel(logging.INFO)
    handler = logging.FileHandler(path, mode="w")
    sink.addHandler(handler)
    logger = MLLogger(logger=sink)
    host = path.stem
    logger.start(key=constants.POWER_MEASUREMENT_START, time_ms=start - 2000)
    if eff is not None:
        logger.event(key=constants.CONVERTION_EFF, value=eff, time_ms=start - 2000)
    if switch:
        logger.event(
            key=constants.INTERCONNECT_POWER_EST,
            value=rng.uniform(200, 400),
            time_ms=start,
            metadata={"host": host},
        )
    else:
        t = start - 2000
        while t <= stop + 2000:
            t += period_ms * rng.uniform(0.8, 1.0)
            logger.event(
                key=constants.POWER_READING, value=rng.uniform(900, 3200), time_ms=t, metadata={"host": host}
            )
    if stop_line:
        logger.end(key=constants.POWER_MEASUREMENT_STOP, time_ms=stop + 2500)
    handler.close()


def add_power(entry: Path, rng: random.Random, nodes: int = 2, switches: int = 1, **kwargs) -> None:
    for result in sorted(entry.glob("result_*.txt")):
        start, stop = _run_window(result)
        folder = entry / "power" / result.stem
        for n in range(nodes):
            write_power_log(folder / f"node_{n}.txt", start, stop, rng, **kwargs)
        for n in range(switches):
            write_power_log(folder / f"sw_{n}.txt", start, stop, rng, switch=True)


def make_entry(
    tmp_path: Path, source: Path, system: Path, scaling: str, files: list[str]
) -> tuple[Path, Path]:
    org = tmp_path / "hpc_results_v3.0" / "Org"
    entry = org / "results" / system.stem / scaling / source.name
    entry.mkdir(parents=True)
    for name in files:
        shutil.copyfile(source / name, entry / name)
    (org / "systems").mkdir()
    shutil.copyfile(system, org / "systems" / system.name)
    return org, entry
