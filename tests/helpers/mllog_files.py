"""MLLOG files for tests: short result logs and logs from (event_type, key, value, metadata) lists written,
logs read back as records, and the official compliance checker run on one."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlhpc.common.contract import catalog
from tests.helpers.cli import cli_env


def write_log(path: Path, seed: int, minutes: float, epochs: int, status: str = "success") -> None:
    start = 1_700_000_000_000
    events = [
        ("POINT_IN_TIME", "seed", seed, {}),
        ("INTERVAL_START", "run_start", None, {}),
        *[("POINT_IN_TIME", "eval_error", 0.5 / e, {"epoch_num": e}) for e in range(1, epochs + 1)],
        ("INTERVAL_END", "run_stop", None, {"status": status}),
    ]
    lines = []
    for kind, key, value, metadata in events:
        time_ms = start + minutes * 60_000 if key == "run_stop" else start
        record = {"namespace": "", "time_ms": time_ms, "event_type": kind, "key": key, "value": value}
        lines.append(":::MLLOG " + json.dumps({**record, "metadata": metadata}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


RULES_FILE = catalog.info("extreme_weather").rules_file
assert RULES_FILE is not None


def _good_events(accuracy: tuple[float, ...] = (0.21, 0.38)) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """(event_type, key, value, metadata) of a short, compliant extreme_weather run."""
    point, start, end = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
    events: list[tuple[str, str, Any, dict[str, Any]]] = [
        (point, "cache_clear", False, {}),
        (start, "init_start", None, {}),
        (point, "submission_benchmark", "extreme_weather", {}),
        (point, "submission_org", "mlhpc", {}),
        (point, "submission_division", "closed", {}),
        (point, "submission_status", "onprem", {}),
        (point, "submission_platform", "cpu", {}),
        (point, "seed", 1, {}),
        (point, "number_of_nodes", 1, {}),
        (point, "accelerators_per_node", 0, {}),
        (point, "global_batch_size", 8, {}),
        (point, "gradient_accumulation_frequency", 1, {}),
        (point, "opt_name", "sgd", {}),
        (point, "opt_base_learning_rate", 0.02, {}),
        (point, "opt_momentum", 0.9, {}),
        (point, "opt_weight_decay", 0.0001, {}),
        (point, "opt_learning_rate_warmup_epochs", 0.5, {}),
        (point, "opt_learning_rate_warmup_factor", 0.01, {}),
        (point, "opt_learning_rate_decay_boundary_epochs", [8, 11], {}),
        (point, "opt_learning_rate_decay_factor", 0.1, {}),
        (end, "init_stop", None, {}),
        (start, "run_start", None, {}),
        (start, "staging_start", None, {}),
        (end, "staging_stop", None, {}),
        (point, "train_samples", 256, {}),
        (point, "eval_samples", 64, {}),
    ]
    for epoch, value in enumerate(accuracy, start=1):
        events += [
            (start, "epoch_start", None, {"epoch_num": epoch}),
            (end, "epoch_stop", None, {"epoch_num": epoch}),
            (start, "eval_start", None, {"epoch_num": epoch}),
            (end, "eval_stop", None, {"epoch_num": epoch}),
            (point, "eval_accuracy", value, {"epoch_num": epoch}),
        ]
    events += [
        (point, "flops_per_sample", 4.1e9, {}),
        (point, "achieved_flops_per_s", 3.0e10, {}),
        (point, "valid_flops", 3.0e10 * (accuracy[-1] / 0.35) ** 5, {}),
        (end, "run_stop", None, {"status": "success", "epoch_num": len(accuracy)}),
    ]
    return events


def _write_log(path: Path, events: list[tuple[str, str, Any, dict[str, Any]]]) -> Path:
    lines = [
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 1_795_000_000_000 + 1000 * i,
                "event_type": kind,
                "key": key,
                "value": value,
                "metadata": {"file": "test.py", "lineno": i, **metadata},
            }
        )
        for i, (kind, key, value, metadata) in enumerate(events)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def official_compliance(
    log: Path, ruleset: str = "3.0.0", rules: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The official checker as its README runs it (HPC usage); `rules` is our own rule file for a
    benchmark mlperf_logging has none for (the engine needs it as an absolute path)."""
    with tempfile.TemporaryDirectory(prefix="compliance-") as scratch:  # its log, not beside the result
        return _run_official(log, ruleset, rules, Path(scratch))


def _run_official(
    log: Path, ruleset: str, rules: Path | None, scratch: Path
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        "hpc",
        "--ruleset",
        ruleset,
    ]
    command += ["--log_output", str(scratch / "compliance.log")]
    if rules is not None:
        command += ["--config", str(Path(rules).resolve())]
    return subprocess.run(
        [*command, str(log)], capture_output=True, text=True, timeout=120, env=cli_env(), cwd=scratch
    )


def mllog_events(path: Path) -> list[dict]:
    """The decoded `:::MLLOG` records of a log (or of captured output with other lines around them)."""
    lines = path.read_text().splitlines()
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in lines if ":::MLLOG" in line]
