"""Finding the entries of a submission and checking its folders and system descriptions.

Nothing here follows a symbolic link out of the checked folder: such a link is a finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.contract import catalog
from mlhpc.common.contract.catalog import required_run_count
from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import (
    SCALINGS,
    SYSTEM_REQUIRED_FIELDS,
    Scaling,
    implementations_dir,
    results_dir,
    results_root,
    system_json_path,
)
from mlhpc.common.safeio import safe_json, safe_read
from mlhpc.common.vocabulary import DIVISIONS

from .findings import (
    RULE_BENCHMARK,
    RULE_IMPLEMENTATION,
    RULE_LAYOUT,
    RULE_RUN_COUNT,
    RULE_SYMLINK,
    RULE_SYSTEM_JSON,
    Finding,
    error,
    warning,
)

RESULT_GLOB = "result_*.txt"
# Files a results/<system>/<scaling>/<benchmark>/ folder may hold besides result_*.txt.
ALLOWED_EXTRA = frozenset({"package_checker_params", "scaling.json", "power"})
# Weak scaling only: results/<system>/weak/<benchmark>/pruned_results/result_<i>.txt, the logs of
# instances pruned after the run (HPC training rules: they must be valid and compliant).
PRUNED_DIR = "pruned_results"
MAX_SYSTEM_JSON_BYTES = 1 * 2**20
_JSON_LINE = re.compile(r" at line (\d+) column \d+\)")
# Fields the summarizer turns into numbers with int() (it stops on anything else).
SYSTEM_INT_FIELDS = ("number_of_nodes", "host_processors_per_node", "accelerators_per_node")
SYSTEM_TEXT_FIELDS = tuple(f for f in SYSTEM_REQUIRED_FIELDS if f not in SYSTEM_INT_FIELDS)
# The official system description checker (mlperf_logging.system_desc_checker) also wants these.
SYSTEM_DESC_CHECKER_FIELDS = (
    "host_processor_core_count",
    "host_processor_vcpu_count",
    "host_processor_frequency",
    "host_processor_caches",
    "host_processor_interconnect",
    "host_memory_capacity",
    "host_storage_type",
    "host_storage_capacity",
    "host_networking",
    "host_networking_topology",
    "host_memory_configuration",
    "accelerator_host_interconnect",
    "accelerator_frequency",
    "accelerator_on-chip_memories",
    "accelerator_memory_configuration",
    "accelerator_memory_capacity",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "cooling",
    "other_software_stack",
    "operating_system",
)


@dataclass(frozen=True)
class EntryDir:
    """One results/<system>/<scaling>/<benchmark>/ folder: what gets one score."""

    submitter_dir: Path
    system: str
    scaling: Scaling
    benchmark: str
    result_files: tuple[Path, ...]
    pruned_files: tuple[Path, ...] = ()
    """Weak scaling: the logs under pruned_results/ (not scored; checked, counted, seeds compared)."""

    @property
    def submitter(self) -> str:
        return self.submitter_dir.name

    @property
    def path(self) -> Path:
        return results_dir(self.submitter_dir, self.system, self.scaling, self.benchmark)


@dataclass(frozen=True)
class SystemDesc:
    """A systems/<system>.json as far as it could be read."""

    fields: dict[str, Any] | None
    """The JSON object, or None when missing or unreadable."""
    findings: tuple[Finding, ...]

    @property
    def division(self) -> str | None:
        value = None if self.fields is None else self.fields.get("division")
        return value if isinstance(value, str) else None


def link_out(path: Path, root: Path) -> str | None:
    """Why `path` must not be followed (a link out of `root`, or a loop), or None."""
    return safe_read.link_out(path, root, outside="the submission")


def _symlink_finding(path: Path, why: str) -> Finding:
    return error(path, RULE_SYMLINK, f"{why}; not read", fix="copy the file into the submission")


def _subdirs(folder: Path, root: Path, findings: list[Finding]) -> list[Path]:
    found: list[Path] = []
    for path in sorted(folder.iterdir()):
        why = link_out(path, root)
        if why is not None:
            findings.append(_symlink_finding(path, why))
        elif path.is_dir():
            found.append(path)
    return found


def find_submitter_dirs(root: Path) -> tuple[list[Path], list[Finding]]:
    """[root] when it is one organisation (has results/), else its subfolders that are."""
    root = Path(root)
    if not root.is_dir():
        raise SubmissionError(f"{root} is not a folder; pass an organisation's or a round's folder")
    if results_root(root).is_dir():
        return [root], []
    findings: list[Finding] = []
    submitters = [d for d in _subdirs(root, root, findings) if results_root(d).is_dir()]
    if not submitters:
        raise SubmissionError(
            f"{root} holds no results/ folder, nor do its subfolders; pass an organisation's "
            "folder (with systems/ and results/) or a folder of them"
        )
    return submitters, findings


def _result_order(path: Path) -> tuple[int, str]:
    index = path.stem.rsplit("_", 1)[-1]
    return (int(index) if index.isdigit() else 1 << 30, path.name)


def find_entries(submitter_dir: Path, root: Path) -> tuple[list[EntryDir], list[Finding]]:
    """The entries under submitter_dir/results, and findings for folders that fit no entry."""
    entries: list[EntryDir] = []
    findings: list[Finding] = []
    for system_dir in _subdirs(results_root(submitter_dir), root, findings):
        for scaling_dir in _subdirs(system_dir, root, findings):
            if scaling_dir.name not in SCALINGS:
                message = f"unknown scaling folder {scaling_dir.name!r}"
                findings.append(error(scaling_dir, RULE_LAYOUT, message, fix="use 'strong' or 'weak'"))
                continue
            scaling: Scaling = "strong" if scaling_dir.name == "strong" else "weak"
            for bench_dir in _subdirs(scaling_dir, root, findings):
                files = _result_files(bench_dir)
                pruned = _pruned_files(bench_dir, scaling, root, findings)
                entries.append(
                    EntryDir(submitter_dir, system_dir.name, scaling, bench_dir.name, files, pruned)
                )
    return entries, findings


def _result_files(folder: Path) -> tuple[Path, ...]:
    found = (p for p in folder.glob(RESULT_GLOB) if p.is_file() or p.is_symlink())
    return tuple(sorted(found, key=_result_order))


def _pruned_files(bench_dir: Path, scaling: Scaling, root: Path, findings: list[Finding]) -> tuple[Path, ...]:
    """The result_*.txt under a weak entry's pruned_results/ (a link out of `root` is a finding)."""
    folder = bench_dir / PRUNED_DIR
    why = link_out(folder, root)
    if why is not None:
        findings.append(_symlink_finding(folder, why))
        return ()
    if scaling != "weak" or not folder.is_dir():
        return ()
    files = _result_files(folder)
    stray = sorted(p.name for p in folder.iterdir() if p not in set(files))
    if stray:
        message = f"unexpected file(s) in {PRUNED_DIR}/: {', '.join(stray[:5])}"
        fix = f"keep only the pruned instances' {RESULT_GLOB} logs there"
        findings.append(warning(folder, RULE_LAYOUT, message, fix=fix))
    return files


def known_benchmarks(ruleset: str) -> list[str]:
    """Benchmarks mlperf_logging allows under `ruleset`, plus the catalog's that bring their own
    rule file (the others can only be checked under mlperf_logging's rules)."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    try:
        allowed = list(get_allowed_benchmarks("hpc", ruleset))
    except ValueError:
        allowed = []
    own = [name for name in catalog.names() if catalog.info(name).rules_file is not None]
    return sorted({*allowed, *own})


def _read_system_json(path: Path, root: Path) -> tuple[Any, Finding | None]:
    why = link_out(path, root)
    if why is not None:
        return None, _symlink_finding(path, why)
    fix = "write systems/<system>.json as one JSON object of the system's fields"
    if not path.is_file():
        return None, error(path, RULE_SYSTEM_JSON, f"missing: results/{path.stem} needs it", fix=fix)
    try:
        if path.stat().st_size > MAX_SYSTEM_JSON_BYTES:
            return None, error(path, RULE_SYSTEM_JSON, "larger than 1 MiB: not a system description", fix=fix)
        # Bounded nesting, finite numbers only: `1e400` or a deep `[[[...]]]` is one finding.
        return safe_json.load_file(path, dict, max_bytes=MAX_SYSTEM_JSON_BYTES), None
    except safe_json.BadJson as e:
        at = _JSON_LINE.search(str(e))  # safe_json says where a syntax error is; keep it as the line
        line = int(at.group(1)) if at else None
        return None, error(path, RULE_SYSTEM_JSON, f"not a JSON object mlhpc reads: {e}", line, fix=fix)
    except OSError as e:
        return None, error(path, RULE_SYSTEM_JSON, f"cannot read: {e.strerror or e}", fix=fix)


def _field_findings(path: Path, desc: dict[str, Any]) -> list[Finding]:
    findings: list[Finding] = []
    missing = [f for f in SYSTEM_REQUIRED_FIELDS if f not in desc]
    if missing:
        message = f"missing required field(s): {', '.join(missing)}"
        findings.append(
            error(path, RULE_SYSTEM_JSON, message, fix="add them; the summarizer skips the system")
        )
    for name in SYSTEM_INT_FIELDS:
        value = desc.get(name)
        if name in desc and (isinstance(value, bool) or not _is_int(value)):
            message = f"{name}={value!r} is not a whole number"
            findings.append(error(path, RULE_SYSTEM_JSON, message, fix=f'write it as e.g. "{name}": "4"'))
    for name in SYSTEM_TEXT_FIELDS:
        if name in desc and not isinstance(desc[name], str):
            message = f"{name}={desc[name]!r} is not a string"
            findings.append(error(path, RULE_SYSTEM_JSON, message, fix="write the value in quotes"))
    if isinstance(desc.get("division"), str) and desc["division"] not in DIVISIONS:
        message = f"division={desc['division']!r}"
        findings.append(error(path, RULE_SYSTEM_JSON, message, fix="use 'closed' or 'open'"))
    more = [f for f in SYSTEM_DESC_CHECKER_FIELDS if f not in desc]
    if more:
        message = f"the official system description checker also wants: {', '.join(more)}"
        findings.append(warning(path, RULE_SYSTEM_JSON, message, fix="add them (an empty string will do)"))
    return findings


def _is_int(value: Any) -> bool:
    try:
        int(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def load_system(submitter_dir: Path, system: str, root: Path) -> SystemDesc:
    """systems/<system>.json read, and checked: a JSON object with every required field, typed."""
    path = system_json_path(submitter_dir, system)
    desc, problem = _read_system_json(path, root)
    if problem is not None:
        return SystemDesc(None, (problem,))
    if not isinstance(desc, dict):
        return SystemDesc(None, (error(path, RULE_SYSTEM_JSON, "must hold a JSON object of system fields"),))
    return SystemDesc(desc, tuple(_field_findings(path, desc)))


def check_benchmark_name(entry: EntryDir, ruleset: str) -> list[Finding]:
    known = known_benchmarks(ruleset)
    if entry.benchmark in known:
        return []
    message = f"no benchmark {entry.benchmark!r} in HPC ruleset {ruleset}"
    return [error(entry.path, RULE_BENCHMARK, message, fix=f"use one of {', '.join(known)}")]


def check_run_count(entry: EntryDir) -> list[Finding]:
    """Strong: exactly the required number of result files; weak: at least that many."""
    required = required_run_count(entry.benchmark)
    found = len(entry.result_files)
    if required is None:
        return []  # check_benchmark_name reports it
    if entry.scaling == "strong" and found != required:
        message = f"{found} {RESULT_GLOB} file(s), strong scaling needs exactly {required}"
        return [error(entry.path, RULE_RUN_COUNT, message, fix=f"submit {required} runs")]
    if entry.scaling == "weak" and found < required:
        message = f"{found} {RESULT_GLOB} file(s), weak scaling needs at least {required}"
        return [error(entry.path, RULE_RUN_COUNT, message, fix=f"submit at least {required} models")]
    return []


def check_stray_files(entry: EntryDir) -> list[Finding]:
    """Files that neither are results nor known extras (the official checker warns too)."""
    results = set(entry.result_files)
    allowed = ALLOWED_EXTRA | ({PRUNED_DIR} if entry.scaling == "weak" else set())
    stray = sorted(p.name for p in entry.path.iterdir() if p not in results and p.name not in allowed)
    if not stray:
        return []
    message = f"unexpected file(s) {', '.join(stray)}"
    return [warning(entry.path, RULE_LAYOUT, message, fix=f"name results {RESULT_GLOB}; move the rest out")]


def check_implementation(submitter_dir: Path, benchmark: str) -> list[Finding]:
    """benchmarks/<benchmark>/implementations/ should hold the code that produced the results."""
    folder = implementations_dir(submitter_dir, benchmark)
    if folder.is_dir():
        return []
    message = f"no {folder.relative_to(submitter_dir)}/ folder"
    return [warning(folder, RULE_IMPLEMENTATION, message, fix="add the code that produced these results")]
