"""AIPerf's own profiler.py and score.py (tests/data/aiperf), run as they are in a subprocess, for the
tests that compare mlhpc's counter and scorer with them.

score.py reads an NNI experiment from $HOME, so `reference_score` writes one under a scratch HOME:
`nni/experiments/<exp>/trials/<trial>/{trial.log, parameter.cfg}` and
`mountdir/nni/experiments/<exp>/hyperparameter_epoch/<trial>/{model.json, <hp>.json}`. TZ=UTC, so
its mktime reads the log's local times as UTC.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.submission_checker.aiperf import EpochRecord

AIPERF = Path(__file__).resolve().parents[1] / "data" / "aiperf"
RESNET50 = AIPERF / "resnet50.json"
EXPERIMENT = "mlhpcExp"

_OPS_SCRIPT = """
import json, os, sys
import profiler
out = []
for index, case in enumerate(json.load(sys.stdin)):
    os.makedirs(str(index))
    model, hyper = os.path.join(str(index), "model.json"), os.path.join(str(index), "0.json")
    with open(model, "w") as f:
        json.dump(case["model"], f)
    with open(hyper, "w") as f:
        json.dump({"hyperparameter": {"kernel_size": case["kernel_size"], "dropout_rate": 0.5}}, f)
    out.append(profiler.cal_trial_flops_per_image(model, hyper))
print(json.dumps(out))
"""

_SCORE_SCRIPT = """
import json, sys
import score
results, trial_id_list, experiment_data = score.cal_report_results(sys.argv[1])
print(json.dumps({"results": results, "trial_id_list": trial_id_list, "experiment_data": experiment_data}))
"""


@dataclass(frozen=True)
class ReferenceTrial:
    """One NNI trial of a scratch experiment."""

    trial_id: str
    parameter_id: int
    """NNI's parameter id: score.py orders trials by it."""
    model: Mapping[str, Any]
    kernel_sizes: Sequence[int]
    """The kernel_size hyperparameter of each hp round (`<hp>.json`)."""
    start: int
    """Unix seconds of the trial's start (its `0.json` start_date)."""
    records: Sequence[EpochRecord]
    """Written to trial.log in this order; each hp round must begin with epoch 1 (how score.py splits them)."""


def reference_ops(cases: Sequence[tuple[Mapping[str, Any], int]], workdir: Path) -> list[tuple[float, float]]:
    """profiler.py's (eval_per_image, train_per_image) of each (graph, kernel_size)."""
    out = _run(_OPS_SCRIPT, [], workdir, {}, stdin=json.dumps([{"model": m, "kernel_size": k} for m, k in cases]))
    return [(eval_ops, train_ops) for eval_ops, train_ops in json.loads(out)]


def reference_score(trials: Sequence[ReferenceTrial], workdir: Path) -> dict[str, Any]:
    """score.py's cal_report_results of the experiment: {"results": {"real_time", "GFLOPS", "Error",
    "Score": lists of strings}, "trial_id_list": [...], "experiment_data": {trial: hp lists}}."""
    home = workdir / "home"
    nni = home / "nni" / "experiments" / EXPERIMENT / "trials"
    mount = home / "mountdir" / "nni" / "experiments" / EXPERIMENT / "hyperparameter_epoch"
    for trial in trials:
        (nni / trial.trial_id).mkdir(parents=True)
        (nni / trial.trial_id / "parameter.cfg").write_text(json.dumps({"parameter_id": trial.parameter_id}))
        (nni / trial.trial_id / "trial.log").write_text(_trial_log(trial.records))
        (mount / trial.trial_id).mkdir(parents=True)
        (mount / trial.trial_id / "model.json").write_text(json.dumps(trial.model))
        for hp, kernel_size in enumerate(trial.kernel_sizes):
            hyper = {
                "hyperparameter": {"kernel_size": kernel_size, "dropout_rate": 0.5},
                "start_date": time.strftime("%m/%d/%Y, %H:%M:%S", time.gmtime(trial.start + 60 * hp)),
            }
            (mount / trial.trial_id / f"{hp}.json").write_text(json.dumps(hyper))
    return json.loads(_run(_SCORE_SCRIPT, [EXPERIMENT], workdir, {"HOME": str(home)}))


def _trial_log(records: Sequence[EpochRecord]) -> str:
    # The Keras log find_all_trials parses: an "Epoch n/N" line, then the line with one [time] and
    # " val_acc: x"; other lines (progress, blanks) are skipped. 12-hour clock, as AIPerf's logger.
    lines = ["[06/01/2020, 08:00:00 AM] PRINT Using TensorFlow backend.", ""]
    for record in records:
        stamp = time.strftime("%m/%d/%Y, %I:%M:%S %p", time.gmtime(record.time))
        lines += [
            f"Epoch {record.epoch}/15",
            "1250/1250 - 100s - loss: 4.2000 - acc: 0.1000",
            f"[{stamp}] PRINT 1250/1250 - 350s - loss: 4.1000 - acc: 0.2000 - val_loss: 3.9000"
            f" - val_acc: {record.accuracy!r}",
            "",
        ]
    return "\n".join(lines) + "\n"


def _run(script: str, args: Sequence[str], workdir: Path, env: Mapping[str, str], stdin: str = "") -> str:
    scratch = workdir / "aiperf_scripts"
    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("profiler.py", "score.py"):
        shutil.copy(AIPERF / name, scratch / name)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=scratch,
        env={**os.environ, "TZ": "UTC", **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"AIPerf's script failed ({done.returncode}):\n{done.stderr}")
    return done.stdout
