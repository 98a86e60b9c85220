"""The RCP check of one entry and the scaling factor its score gets, with their findings.

The factor is the one the official summarizer settles on (from its second run on): the RCP
check's when that check compares the runs, else a `scaling.json` already in the folder, else 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

from mlhpc.common.contract import catalog
from mlhpc.common.layout import results_root
from mlhpc.common.safeio import safe_json

from .compliance import LogAnalysis
from .findings import RULE_RCP, RULE_SCALING_JSON, Finding, warning
from .layout_checks import EntryDir
from .rcp import (
    BYPASS_FILE,
    BYPASS_LINE,
    MSG_NONE,
    NOT_CONVERGED_EPOCHS,
    RcpRead,
    RcpResult,
    check_rcp,
    has_bypass,
)

SCALING_JSON = "scaling.json"
MAX_SCALING_JSON_BYTES = 4096


def _reads(files: Sequence[LogAnalysis]) -> list[RcpRead]:
    """What the official RCP reader gets from each file (an unread file stops it, as there)."""
    reads = []
    for a in files:
        if a.log is None:
            reason = "the file could not be read" if a.refused is None else a.refused[1]
            reads.append(RcpRead(False, NOT_CONVERGED_EPOCHS, -1, None, f"{Path(a.path).name}: {reason}"))
        else:
            reads.append(a.log.rcp)
    return reads


def read_scaling_json(folder: Path) -> tuple[float | None, list[Finding]]:
    """The factor in folder/scaling.json, if there is a usable one."""
    path = folder / SCALING_JSON
    if not path.is_file() or path.is_symlink():
        return None, []
    fix = 'delete it, or write {"scaling_factor": <number>}'
    try:
        if path.stat().st_size > MAX_SCALING_JSON_BYTES:
            raise ValueError("larger than 4 KiB")
        value = safe_json.load_file(path, dict, max_bytes=MAX_SCALING_JSON_BYTES)["scaling_factor"]
        factor = float(value)
        if isinstance(value, bool) or not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"scaling_factor={value!r}")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        message = f"unusable ({type(e).__name__}: {e}); the official summarizer stops on it"
        return None, [warning(path, RULE_SCALING_JSON, message, fix=fix)]
    return factor, []


@functools.cache
def smoke_batch(benchmark: str) -> int | None:
    """The global batch size of `benchmark`'s packaged `mini` config (a smoke configuration with no
    reference convergence point), or None when it is not one of ours or has no mini."""
    import yaml

    found = catalog.find(benchmark)
    if found is None:
        return None
    try:
        config = yaml.safe_load((found.configs_dir / "mini.yaml").read_text(encoding="utf-8"))
        batch = config["loop"]["global_batch_size"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else None


def rcp_configs(benchmark: str) -> list[str]:
    """`benchmark`'s packaged rcp_<batch> configs, smallest batch first."""
    found = catalog.find(benchmark)
    if found is None:
        return []
    names = [p.stem for p in found.configs_dir.glob("rcp_*.yaml") if p.stem[4:].isdigit()]
    return sorted(names, key=lambda name: int(name[4:]))


def as_smoke(benchmark: str, result: RcpResult) -> RcpResult:
    """A failed check for lack of a reference at the batch size of our own `mini` config becomes
    verdict "smoke": nothing to fix in the run, and nothing the RCP data can say about it."""
    no_reference = result.message.startswith("Missing RCP") or result.message == MSG_NONE
    batch = smoke_batch(benchmark)
    if result.verdict != "fail" or not no_reference or batch is None or result.batch_size != batch:
        return result
    message = (
        f"batch size {batch} is the mini configuration's: a smoke configuration, with no reference "
        "convergence point (RCP) to compare against, and none is meant to exist"
    )
    return RcpResult(**{**result.__dict__, "verdict": "smoke", "message": message})


def _smoke_finding(entry: EntryDir, result: RcpResult) -> Finding:
    configs = rcp_configs(entry.benchmark)
    listed = ", ".join(configs) if configs else "an rcp_<batch> config"
    fix = (
        f"nothing, for a smoke run; for a run the RCP check compares, use one of {entry.benchmark}'s "
        f"rcp_<batch> configs ({listed}): mlhpc run {entry.benchmark} --config {configs[0] if configs else 'rcp_<batch>'}"
    )
    message = f"RCP: no comparison: {result.message}; the official package checker would not accept it"
    return warning(entry.path, RULE_RCP, message, fix=fix)


def _rcp_finding(entry: EntryDir, result: RcpResult) -> list[Finding]:
    if result.verdict == "pass":
        return []
    if result.verdict == "smoke":
        return [_smoke_finding(entry, result)]
    numbers = ""
    if result.evaluated:
        numbers = (
            f": mean epochs to converge {result.submission_mean:.4f} < {result.min_epochs:.4f} "
            f"(RCP mean {result.rcp_mean:.4f} of {result.reference}, batch size {result.batch_size})"
        )
    where = f"results/{entry.system}/ or this folder"
    bypass = f"put a {BYPASS_FILE} file holding exactly {BYPASS_LINE!r} (no newline) in {where}"
    if (entry.submitter_dir / BYPASS_FILE).is_file():
        bypass += f" (the organisation-level {BYPASS_FILE} is ignored by the official code)"
    if result.verdict == "bypassed":
        message = f"RCP test failed ({result.message}){numbers}; passed with rcp-bypass"
        return [warning(entry.path, RULE_RCP, message, fix="be ready to explain it to the review committee")]
    if result.verdict == "error":
        message = f"RCP test not possible: {result.message}"
        return [
            warning(
                entry.path,
                RULE_RCP,
                message,
                fix="log global_batch_size, eval lines with epoch_num, run_stop status",
            )
        ]
    message = f"RCP test failed ({result.message}){numbers}; the official package checker rejects it"
    fix = f"converge with the reference hyperparameters, or, if the committee agrees, {bypass}"
    return [warning(entry.path, RULE_RCP, message, fix=fix)]


def entry_rcp(
    entry: EntryDir, files: Sequence[LogAnalysis], ruleset: str, *, closed: bool
) -> tuple[RcpResult | None, float, list[Finding]]:
    """(RCP decision or None, scaling factor for the score, findings) for one entry."""
    committed, findings = read_scaling_json(entry.path)
    result: RcpResult | None = None
    if closed and files:
        bypass = has_bypass(entry.path) or has_bypass(results_root(entry.submitter_dir) / entry.system)
        result = as_smoke(entry.benchmark, check_rcp(_reads(files), ruleset, bypass=bypass))
        findings += _rcp_finding(entry, result)
    if entry.scaling == "weak":
        return result, 1.0, findings  # the summarizer scales no weak score
    if result is not None and result.evaluated:
        if committed is not None and not math.isclose(committed, result.scaling_factor, rel_tol=1e-12):
            message = (
                f"says {committed!r}, the RCP check gives {result.scaling_factor!r}: the official "
                "summarizer scores with the file's factor on its first run, then rewrites it"
            )
            findings.append(warning(entry.path / SCALING_JSON, RULE_SCALING_JSON, message, fix="delete it"))
        return result, result.scaling_factor, findings
    return result, 1.0 if committed is None else committed, findings
