"""AIPerf's score of a run folder: every file read as hostile, then AIPerf's own arithmetic
(submission_checker/aiperf.py) over AIPerf's own count (ops_count.py). Read-only; no torch, so
`mlhpc check` runs on a login node.
"""

from __future__ import annotations

import json
import math
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlhpc.benchmarks.aiperf.experiment import (
    RUN_DIR,
    RUN_FILE,
    RunFacts,
    read_graph_json,
    read_run_facts,
    read_small,
)
from mlhpc.benchmarks.aiperf.ops_count import OpsPerImage, ops_per_image
from mlhpc.common.errors import DataError
from mlhpc.common.printable import shown
from mlhpc.submission_checker.aiperf import EpochRecord, Window, final, valid, windows

MAX_WINDOWS = 100_000
"""A run's score windows at most: a year at AIPerf's 0.1 h is 87,600."""
SCORE_FORMAT = "mlhpc-aiperf-score/1"
"""The first key of the JSON `mlhpc check --json` and `mlhpc report --json` write of a run."""
MAX_LOG_BYTES = 64 * 2**20
_ARCH = re.compile(r"\d{5,9}\Z")
_HP = re.compile(r"hp_(\d{1,4})\.json\Z")


@dataclass(frozen=True)
class Point:
    """One finished epoch, for the report's plot of the trials."""

    seconds: float
    """After the run's start."""
    accuracy: float
    arch: str
    round: int
    node: str


@dataclass(frozen=True)
class RunScore:
    """A run's AIPerf figures: every window, the final one, and whether it is valid."""

    windows: list[Window]
    final: Window | None
    best_accuracy: float
    threshold: float
    valid: bool
    architectures: int
    trainings: int
    epochs: int
    nodes: int
    duration_s: float
    points: list[Point]

    def to_json(self) -> dict[str, Any]:
        return {"format": SCORE_FORMAT, **asdict(self)}


def find_run(path: Path) -> Path | None:
    """The AIPerf run folder `path` is or holds (an `mlhpc run aiperf --out`), else None."""
    for candidate in (path, path / RUN_DIR):
        if (candidate / RUN_FILE).is_file():
            return candidate
    return None


def score_run(run_dir: Path) -> RunScore:
    facts = read_run_facts(run_dir)
    config = _config(run_dir)
    threshold, first, step, train_images, eval_images = _score_settings(run_dir, config, facts)
    records: list[EpochRecord] = []
    points: list[Point] = []
    ops: dict[tuple[str, int], OpsPerImage] = {}
    architectures = 0
    trials = run_dir / "trials"
    for folder in sorted(trials.iterdir()) if trials.is_dir() else []:
        if not _ARCH.match(folder.name) or not _real_dir(folder):
            raise DataError(f"{folder}: not an architecture's folder of an AIPerf run; move it out of {trials}")
        model = _model(folder)
        if model is None:
            continue  # made by a node lost before it wrote the graph: nothing of it ran
        architectures += 1
        rounds = _rounds(folder)
        for round_, kernel in rounds.items():
            ops[(folder.name, round_)] = ops_per_image(model, kernel)
        for record, node in _epochs(folder, set(rounds), facts):
            records.append(record)
            points.append(Point(record.time - facts.start, record.accuracy, record.trial, record.hp, node))
    records.sort(key=lambda r: r.time)
    points.sort(key=lambda p: p.seconds)
    scored = windows(
        records, ops, facts.start, train_images=train_images, eval_images=eval_images,
        first_hours=first, step_hours=step, duration_hours=facts.duration_s / 3600.0,
    )
    best = max((r.accuracy for r in records), default=0.0)
    return RunScore(
        windows=scored,
        final=final(scored),
        best_accuracy=best,
        threshold=threshold,
        valid=bool(records) and valid(best, threshold),
        architectures=architectures,
        trainings=len({(r.trial, r.hp) for r in records}),
        epochs=len(records),
        nodes=int(config.get("_nodes", 0)),
        duration_s=facts.duration_s,
        points=points,
    )


def _score_settings(run_dir: Path, config: dict[str, Any], facts: RunFacts) -> tuple[float, float, float, int, int]:
    """(threshold, first window, step, train and eval images an epoch) from the run's config."""
    score_cfg = config.get("score", {})
    try:
        if not isinstance(score_cfg, dict):
            raise TypeError("score is not a mapping")
        threshold = float(score_cfg.get("threshold", 0.7))
        first = float(score_cfg.get("first_window_hours", 0.2))
        step = float(score_cfg.get("step_hours", 0.1))
        train_images = score_cfg.get("train_images") or facts.train_images
        eval_images = score_cfg.get("eval_images") or facts.eval_images
        if not (0 < threshold < 1 and 0 < first <= 10**4 and 0 < step <= 10**4) or not all(
            type(n) is int and 0 < n < 2**40 for n in (train_images, eval_images)
        ):
            raise ValueError("out of range")
        if facts.duration_s / 3600.0 / step > MAX_WINDOWS:  # numpy.arange would build them all
            raise ValueError(f"step_hours {step} makes over {MAX_WINDOWS} windows")
    except (TypeError, ValueError, OverflowError) as e:
        raise DataError(f"{run_dir / RUN_FILE}: score settings {e}; it is written by mlhpc run aiperf") from e
    return threshold, first, step, train_images, eval_images


def _config(run_dir: Path) -> dict[str, Any]:
    data = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))  # read_run_facts checked it
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    nodes = data.get("nodes")
    config = dict(config)
    config["_nodes"] = nodes if type(nodes) is int and 0 < nodes < 10**6 else 0
    return config


def _real_dir(path: Path) -> bool:
    return stat.S_ISDIR(path.lstat().st_mode)


def _model(folder: Path) -> dict[str, Any] | None:
    from mlhpc.benchmarks.aiperf.graph import Graph

    path = folder / "model.json"
    if not path.exists():
        return None
    return Graph.from_json(read_graph_json(path), str(path)).to_json()  # validated: the counter trusts its shapes


def _rounds(folder: Path) -> dict[int, int]:
    """{round: kernel size} of the architecture's trainings (hp_<round>.json)."""
    rounds = {}
    for path in folder.glob("hp_*.json"):
        found = _HP.match(path.name)
        if not found:
            continue
        try:
            data = json.loads(read_small(path, 2**16))
            kernel = data["hyperparameter"]["kernel_size"]
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError) as e:
            raise DataError(f"{path}: not a training's hyperparameters ({e.__class__.__name__})") from e
        if type(kernel) is not int or not 1 <= kernel <= 31:
            raise DataError(f"{path}: kernel_size {repr(kernel)[:20]} is not an int from 1 to 31")
        rounds[int(found.group(1))] = kernel
    return rounds


def _epochs(folder: Path, rounds: set[int], facts: RunFacts) -> list[tuple[EpochRecord, str]]:
    """epochs.jsonl's records; a torn last line (a node killed while writing it) is skipped, any
    other bad line is one error naming the file and line."""
    path = folder / "epochs.jsonl"
    if not path.exists():
        return []
    lines = read_small(path, MAX_LOG_BYTES).split(b"\n")
    torn_last = lines[-1] != b""
    found = []
    for number, raw in enumerate(lines[:-1] if not torn_last else lines, start=1):
        try:
            item = json.loads(raw)
            record = _record(item, folder.name, rounds, facts)
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, KeyError, TypeError) as e:
            if torn_last and number == len(lines):
                continue
            raise DataError(f"{path}:{number}: not an epoch record ({shown(str(e))[:120]}); it is written by the run") from e
        found.append(record)
    return found


def _record(item: Any, arch: str, rounds: set[int], facts: RunFacts) -> tuple[EpochRecord, str]:
    if not isinstance(item, dict):
        raise ValueError("not an object")
    round_, epoch, when, accuracy = item["round"], item["epoch"], item["time"], item["accuracy"]
    if type(round_) is not int or round_ not in rounds:
        raise ValueError(f"round {repr(round_)[:20]} has no hp_<round>.json")
    if type(epoch) is not int or not 1 <= epoch <= 10**5:
        raise ValueError(f"epoch {repr(epoch)[:20]} is not 1 to 100000")
    if type(when) not in (int, float) or not math.isfinite(when) or not facts.start <= when <= facts.deadline:
        raise ValueError(f"time {repr(when)[:30]} is outside the run (start to start + duration)")
    if type(accuracy) not in (int, float) or not 0 <= accuracy <= 1:
        raise ValueError(f"accuracy {repr(accuracy)[:30]} is not from 0 to 1")
    host, index = item.get("node", ""), item.get("node_index", 0)
    if not isinstance(host, str) or len(host) > 255 or not host.isprintable():
        raise ValueError("node is not a host name")
    if type(index) is not int or not 0 <= index < 10**6:
        raise ValueError(f"node_index {repr(index)[:20]} is not a node's index")
    node = f"node {index} ({host})" if host else f"node {index}"
    record = EpochRecord(trial=arch, hp=round_, epoch=epoch, time=float(when), accuracy=float(accuracy))
    return record, node


def check_run(run_dir: Path, json_path: Path | None = None) -> int:
    """`mlhpc check` of an AIPerf run: the score over time and its validity; 0 valid, 1 not valid,
    2 when it cannot be scored (one line saying why)."""
    import sys

    from mlhpc.common.errors import MlhpcError
    from mlhpc.common.printable import shown

    try:
        if json_path is not None:
            from mlhpc.common.safeio.writable import json_kind, refuse_output_over_inputs

            json_path = refuse_output_over_inputs(json_path, [run_dir], "--json", kind=json_kind(SCORE_FORMAT))
        result = score_run(run_dir)
    except (MlhpcError, ValueError, OSError) as e:
        print(f"mlhpc: error: {shown(str(e))}", file=sys.stderr)
        return 2
    print(f"AIPerf run {run_dir}: {result.nodes} nodes, {result.duration_s / 60:g} min, "
          f"{result.architectures} architectures, {result.trainings} trainings, {result.epochs} epochs")
    print(f"{'hours':>6} {'OPS':>12} {'best top-1':>10} {'score (regulated OPS)':>22}")
    for w in result.windows:
        print(f"{w.hours:>6.3f} {w.ops_per_second:>12.4g} {w.best_accuracy:>10.4f} {w.score:>22.4g}")
    if result.final is not None:
        print(f"AIPerf score: {result.final.ops_per_second:.4g} OPS, regulated {result.final.score:.4g}")
    verdict = "valid" if result.valid else "NOT valid"
    print(f"{verdict}: best top-1 {result.best_accuracy:.4f}, threshold {result.threshold:.4f}")
    if json_path is not None:
        from mlhpc.common.safeio.fileio import atomic_write_json

        atomic_write_json(json_path, result.to_json())
    return 0 if result.valid else 1
