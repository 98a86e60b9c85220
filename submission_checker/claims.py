"""Claims no official tool checks: what the logs say about the system against systems/<system>.json.

Both are warnings: the published score stands as the summarizer computes it, but a reviewer
should see a submission whose logs describe another organisation, division or system, or whose
weak-scaling instances could not all have run at once on the system it describes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlhpc.common.layout import system_json_path

from .compliance import LogAnalysis
from .findings import RULE_LOG_SYSTEM, RULE_SCALE_CLAIM, Finding, warning
from .layout_checks import EntryDir, SystemDesc

PLACEHOLDER = "PLACEHOLDER"
# A platform is often logged as "<nodes>x<name>", e.g. "256xNVIDIA DGX H100".
_NODES_PREFIX = re.compile(r"^\s*\d+\s*x\s*", re.IGNORECASE)
_SPLIT_ORG = re.compile(r"[+/,&]| and ")
MAX_SHOWN = 3
# submission_status has carried two meanings: where the system runs (older logs) and whether it
# can be had (the system description's status); values are compared only within one of them.
STATUS_VOCABULARIES = (frozenset({"onprem", "cloud"}), frozenset({"available", "preview", "research", "rdi"}))


def _norm(value: object) -> str:
    return re.sub(r"[^a-z0-9]", "", str(value).lower())


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _submitter_matches(logged: Any, names: Sequence[str]) -> bool:
    wanted = _norm(logged)
    parts = {_norm(p) for n in names for p in [n, *_SPLIT_ORG.split(n)]}
    return bool(wanted) and wanted in parts


def _system_matches(logged: Any, names: Sequence[str]) -> bool:
    wanted = _norm(_NODES_PREFIX.sub("", str(logged)))
    return bool(wanted) and wanted in {_norm(_NODES_PREFIX.sub("", n)) for n in names}


def _status_agrees(logged: Any, described: Any) -> bool:
    """Equal, or from the other vocabulary (not comparable); an unknown logged value never agrees."""
    if not isinstance(described, str):
        return True
    value, wanted = _norm(logged), _norm(described)
    if value == wanted:
        return True
    if not any(value in words for words in STATUS_VOCABULARIES):
        return False
    return not any(value in words and wanted in words for words in STATUS_VOCABULARIES)


def _field_check(
    key: str,
    values: dict[str, tuple[Any, int]],
    first_file: dict[str, str],
    expected: str,
    agrees: Callable[[Any], bool],
    fix: str,
    where: Path,
) -> list[Finding]:
    wrong = [v for v in values if not agrees(values[v][0])]
    if not wrong:
        return []
    shown = "; ".join(
        f"{_show(values[v][0])} in {values[v][1]} log(s), e.g. {first_file[v]}" for v in wrong[:MAX_SHOWN]
    )
    placeholder = any(PLACEHOLDER in str(values[v][0]).upper() for v in wrong)
    message = f"the logs' {key} disagrees with {expected}: {shown}"
    if placeholder:
        message += " (a placeholder never filled in)"
    return [warning(where, RULE_LOG_SYSTEM, message, fix=fix)]


def _logged(
    files: Sequence[LogAnalysis], attribute: str
) -> tuple[dict[str, tuple[Any, int]], dict[str, str]]:
    """{repr(value): (value, count)} of one RunLog field over the files, and each value's first file."""
    seen: dict[str, list[Any]] = {}
    first: dict[str, str] = {}
    for a in files:
        value = None if a.log is None else getattr(a.log, attribute)
        if value is None:
            continue
        key = repr(value)
        if key not in seen:
            seen[key] = [value, 0]
            first[key] = Path(a.path).name
        seen[key][1] += 1
    return {k: (v[0], v[1]) for k, v in seen.items()}, first


def check_logs_against_system(
    entry: EntryDir, files: Sequence[LogAnalysis], system: SystemDesc
) -> list[Finding]:
    """submission_org/platform/division/status, number_of_nodes and accelerators_per_node in the
    logs against systems/<system>.json and the folders they sit in (mlcommons/logging#241)."""
    desc = system.fields
    if desc is None:
        return []  # load_system already reported why
    findings: list[Finding] = []
    for key, attribute, expected, agrees, fix in _claims(entry, desc):
        values, first = _logged(files, attribute)
        findings += _field_check(key, values, first, expected, agrees, fix, entry.path)
    return findings


_Claim = tuple[str, str, str, Callable[[Any], bool], str]
"""(MLLOG key, its LogAnalysis attribute, what it must agree with, the check, the fix)."""


def _claims(entry: EntryDir, desc: dict[str, Any]) -> list[_Claim]:
    """What the folders and the system description say each logged key must be: a table."""
    json_name = (
        system_json_path(entry.submitter_dir, entry.system).relative_to(entry.submitter_dir).as_posix()
    )
    submitters = [entry.submitter, *([desc["submitter"]] if isinstance(desc.get("submitter"), str) else [])]
    systems = [entry.system, *([desc["system_name"]] if isinstance(desc.get("system_name"), str) else [])]
    return [
        (
            "submission_org",
            "submitter",
            f"the organisation folder {entry.submitter!r} and {json_name}'s submitter",
            lambda v: _submitter_matches(v, submitters),
            "log the organisation's name as submission_org",
        ),
        (
            "submission_platform",
            "system",
            f"the system folder {entry.system!r} and {json_name}'s system_name",
            lambda v: _system_matches(v, systems),
            "log the system's name (systems/<system>.json system_name) as submission_platform",
        ),
        (
            "submission_division",
            "division",
            f"{json_name}'s division {desc.get('division')!r}",
            lambda v: not isinstance(desc.get("division"), str) or v == desc["division"],
            "submit the entry under the division its logs were run for",
        ),
        (
            "submission_status",
            "status",
            f"{json_name}'s status {desc.get('status')!r}",
            lambda v: _status_agrees(v, desc.get("status")),
            "log the system's availability as submission_status, as the system description says",
        ),
        *_hardware_claims(entry, desc, json_name),
    ]


def _hardware_claims(entry: EntryDir, desc: dict[str, Any], json_name: str) -> list[_Claim]:
    """The nodes and accelerators the system description gives (a weak entry's instance may use fewer nodes)."""
    nodes, accelerators = _int(desc.get("number_of_nodes")), _int(desc.get("accelerators_per_node"))

    def fits_nodes(v: Any) -> bool:
        n = _int(v)
        return nodes is None or (
            n == nodes if entry.scaling == "strong" else n is not None and 0 < n <= nodes
        )

    return [
        (
            "number_of_nodes",
            "number_of_nodes",
            f"{json_name}'s number_of_nodes {desc.get('number_of_nodes')!r}"
            + ("" if entry.scaling == "strong" else " (an instance can use at most that many)"),
            fits_nodes,
            "describe the system the runs used in systems/<system>.json, or log the nodes each run used",
        ),
        (
            "accelerators_per_node",
            "accelerators_per_node",
            f"{json_name}'s accelerators_per_node {desc.get('accelerators_per_node')!r}",
            lambda v: accelerators is None or _int(v) == accelerators,
            "log the accelerators each node used as accelerators_per_node",
        ),
    ]


def _peak(intervals: Sequence[tuple[float, float, int]]) -> tuple[int, int]:
    """(most nodes in use at one moment, instances running then) over (start, stop, nodes)."""
    events = sorted([(s, 1, n) for s, _, n in intervals] + [(e, 0, n) for _, e, n in intervals])
    used = running = best = best_running = 0
    for _, starts, n in events:  # at equal times a stop (0) sorts before a start (1)
        used, running = (used + n, running + 1) if starts else (used - n, running - 1)
        if used > best:
            best, best_running = used, running
    return best, best_running


def check_scale_claim(entry: EntryDir, files: Sequence[LogAnalysis], system: SystemDesc) -> list[Finding]:
    """Weak scaling: the instances running at one moment (kept and pruned) must fit in the system.

    Each instance logs its own number_of_nodes and accelerators_per_node; instances whose
    run_start..run_stop overlap ran at once, so their nodes add up, and the sum cannot exceed
    the number_of_nodes of systems/<system>.json.
    """
    desc = system.fields
    if entry.scaling != "weak" or desc is None:
        return []
    nodes, per_node = _int(desc.get("number_of_nodes")), _int(desc.get("accelerators_per_node"))
    if nodes is None or nodes <= 0:
        return []
    intervals = []
    scales: Counter = Counter()
    for a in files:
        log = a.log
        n = None if log is None else _int(log.number_of_nodes)
        if log is None or n is None or n <= 0 or not log.has_start_stop:
            continue
        if (
            log.run_stop_ms is not None
            and log.run_start_ms is not None
            and log.run_stop_ms >= log.run_start_ms
        ):
            intervals.append((log.run_start_ms, log.run_stop_ms, n))
            scales[(n, _int(log.accelerators_per_node))] += 1
    used, running = _peak(intervals)
    if used <= nodes:
        return []
    (n, a), _ = scales.most_common(1)[0]
    each = f"{n} node(s) × {a} accelerator(s)" if a else f"{n} node(s)"
    system_size = f"{nodes} nodes" + (f" × {per_node} accelerators ({nodes * per_node})" if per_node else "")
    accelerators = f" ({used * per_node} accelerators)" if per_node else ""
    json_name = (
        system_json_path(entry.submitter_dir, entry.system).relative_to(entry.submitter_dir).as_posix()
    )
    message = (
        f"{running} of {len(intervals)} instances run at the same time (their run_start..run_stop "
        f"overlap), mostly each on {each}: {used} nodes{accelerators} at once, but {json_name} has "
        f"{system_size}; the claimed scale cannot be true (the published score stands as computed)"
    )
    fix = "log each instance's own number_of_nodes and accelerators_per_node, or describe the whole system"
    return [warning(entry.path, RULE_SCALE_CLAIM, message, fix=fix)]
