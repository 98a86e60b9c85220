"""An AIPerf run's folder on the shared file system: who starts the run, and its facts (no torch:
the checker reads them on a login node; worker.py is each node's loop in it). `<out>/aiperf/` holds:

    aiperf.json           the run's facts: config, start time, duration, dataset sizes (written once)
    study.journal         Optuna's journal of the search (every node appends, under its file lock)
    trials/<arch>/        one architecture: model.json (NNI's graph JSON), hp_<round>.json (the
                          hyperparameters of each training of it), epochs.jsonl (one line an epoch)
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.benchmarks.aiperf.config import AIPerfConfig
from mlhpc.common.contract.config import to_dict
from mlhpc.common.errors import DataError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.locks import folder_lock

RUN_DIR = "aiperf"
RUN_FILE = "aiperf.json"
FORMAT = "mlhpc-aiperf/1"
JOIN_TIMEOUT_S = 600.0  # a node waits this long for another that is starting or joining the run
NODE_ENV = "MLHPC_AIPERF_NODE"
"""Set by `mlhpc run aiperf --instances K` for each one-rank node it starts on one machine: `<node>/<nodes>`."""


@dataclass(frozen=True)
class RunFacts:
    """aiperf.json: what every node and the scorer read."""

    start: float
    duration_s: float
    train_images: int
    eval_images: int
    classes: int
    seed: int

    @property
    def deadline(self) -> float:
        return self.start + self.duration_s


def join_run(
    out: Path, cfg: AIPerfConfig, train_images: int, eval_images: int, classes: int, seed: int, nodes: int
) -> RunFacts:
    """The run in `out`: started by the first node to come (which writes aiperf.json), joined by the
    others. A finished run's folder is refused: its score would mix two runs."""
    joining = f"an AIPerf node joining the run (seed {seed})"
    with folder_lock(out, joining, "wait for it, or stop it if it hangs", wait_s=JOIN_TIMEOUT_S):
        path = out / RUN_FILE
        if not path.exists():
            facts = RunFacts(
                start=time.time(),
                duration_s=cfg.search.duration_minutes * 60.0,
                train_images=train_images,
                eval_images=eval_images,
                classes=classes,
                seed=seed,
            )
            record = {
                "format": FORMAT,
                "benchmark": "aiperf",
                "start": facts.start,
                "duration_s": facts.duration_s,
                "train_images": train_images,
                "eval_images": eval_images,
                "classes": classes,
                "seed": seed,
                "nodes": nodes,
                "config": to_dict(cfg),
            }
            atomic_write_text(path, json.dumps(record, indent=1))
            return facts
        facts = read_run_facts(out)
        if time.time() > facts.deadline:
            raise DataError(f"{out} holds an AIPerf run that has ended; pass a new --out for a new run")
        return facts


def read_run_facts(run_dir: Path) -> RunFacts:
    """aiperf.json, checked: a hostile or torn file is one line naming it."""
    from mlhpc.common.safeio import safe_json

    path = run_dir / RUN_FILE
    try:
        data = safe_json.loads(path.read_bytes(), dict)
        facts = RunFacts(
            start=_number(data, "start", 0, 2**35),
            duration_s=_number(data, "duration_s", 1e-3, 10**8),
            train_images=int(_number(data, "train_images", 1, 2**40)),
            eval_images=int(_number(data, "eval_images", 1, 2**40)),
            classes=int(_number(data, "classes", 2, 10**7)),
            seed=int(_number(data, "seed", 0, 2**63)),
        )
        if data.get("format") != FORMAT:
            raise ValueError(f"format {str(data.get('format'))[:40]!r}, not {FORMAT!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not an AIPerf run's facts ({shown(str(e))[:200]}); point at an mlhpc AIPerf run") from e
    return facts


def _number(data: dict[str, Any], key: str, low: float, high: float) -> float:
    value = data[key]
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"{key}={repr(value)[:40]} is not a number from {low} to {high}")
    return float(value)


MAX_MODEL_BYTES = 16 * 2**20
"""A graph JSON of the 10,000 layers graph.py allows is under 1 MB; more is not one of ours."""


def read_small(path: Path, limit: int) -> bytes:
    """A run file's bytes: a regular file (not a link, FIFO or device) of at most `limit` bytes, else
    one DataError naming it (the nodes' files are read as hostile)."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"{path}: not a regular file; an AIPerf run writes it as one, move it away")
        if info.st_size > limit:
            raise DataError(f"{path}: {info.st_size} bytes, over the {limit} an AIPerf run writes; move it away")
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e}); check the run's folder") from e


def read_graph_json(path: Path) -> Any:
    """An architecture's model.json, parsed (Graph.from_json validates what it holds)."""
    try:
        return json.loads(read_small(path, MAX_MODEL_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"{path}: not JSON ({e.__class__.__name__}); it is the architecture's graph") from e


def node_from_env() -> tuple[int, int] | None:
    """(node, nodes) of an --instances node, or None."""
    from mlhpc.common.errors import ConfigError
    from mlhpc.common.printable import shown

    value = os.environ.get(NODE_ENV)
    if not value:
        return None
    node, _, nodes = value.partition("/")
    try:
        n, total = int(node), int(nodes)
    except ValueError:
        raise ConfigError(f"{NODE_ENV}={shown(value)} must be <node>/<nodes>; unset it") from None
    if not 0 <= n < total <= 4096:
        raise ConfigError(f"{NODE_ENV}={shown(value)} must be <node>/<nodes> with 0 <= node < nodes; unset it")
    return n, total
