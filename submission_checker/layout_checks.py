"""Finding the entries of a submission and checking its folders and system descriptions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import (
    OWN_RESULT_COUNTS,
    SCALINGS,
    SYSTEM_REQUIRED_FIELDS,
    Scaling,
    required_run_count,
    system_json_path,
)

from .findings import (
    RULE_BENCHMARK,
    RULE_IMPLEMENTATION,
    RULE_LAYOUT,
    RULE_RUN_COUNT,
    RULE_SYSTEM_JSON,
    Finding,
    error,
    warning,
)

RESULT_GLOB = "result_*.txt"
# Files a results/<system>/<scaling>/<benchmark>/ folder may hold besides result_*.txt.
ALLOWED_EXTRA = frozenset({"package_checker_params", "scaling.json", "power"})


@dataclass(frozen=True)
class EntryDir:
    """One results/<system>/<scaling>/<benchmark>/ folder: what gets one score."""

    org_dir: Path
    system: str
    scaling: Scaling
    benchmark: str
    result_files: tuple[Path, ...]

    @property
    def submitter(self) -> str:
        return self.org_dir.name

    @property
    def path(self) -> Path:
        return self.org_dir / "results" / self.system / self.scaling / self.benchmark


def _result_order(path: Path) -> tuple[int, str]:
    index = path.stem.rsplit("_", 1)[-1]
    return (int(index) if index.isdigit() else 1 << 30, path.name)


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def find_org_dirs(root: Path) -> list[Path]:
    """[root] when it is one organisation (has results/), else its subfolders that are."""
    root = Path(root)
    if not root.is_dir():
        raise SubmissionError(f"{root} is not a folder; pass an organisation's or a round's folder")
    if (root / "results").is_dir():
        return [root]
    orgs = [d for d in _subdirs(root) if (d / "results").is_dir()]
    if not orgs:
        raise SubmissionError(
            f"{root} holds no results/ folder, nor do its subfolders; pass an organisation's "
            "folder (with systems/ and results/) or a folder of them"
        )
    return orgs


def find_entries(org_dir: Path) -> tuple[list[EntryDir], list[Finding]]:
    """The entries under org_dir/results, and findings for folders that fit no entry."""
    entries: list[EntryDir] = []
    findings: list[Finding] = []
    for system_dir in _subdirs(org_dir / "results"):
        for scaling_dir in _subdirs(system_dir):
            if scaling_dir.name not in SCALINGS:
                findings.append(
                    error(
                        scaling_dir,
                        RULE_LAYOUT,
                        f"unknown scaling folder {scaling_dir.name!r}; use 'strong' or 'weak'",
                    )
                )
                continue
            scaling: Scaling = "strong" if scaling_dir.name == "strong" else "weak"
            for bench_dir in _subdirs(scaling_dir):
                files = sorted((p for p in bench_dir.glob(RESULT_GLOB) if p.is_file()), key=_result_order)
                entries.append(EntryDir(org_dir, system_dir.name, scaling, bench_dir.name, tuple(files)))
    return entries, findings


def known_benchmarks(ruleset: str) -> list[str]:
    """Benchmarks mlperf_logging allows under `ruleset`, plus this project's own."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    try:
        allowed = list(get_allowed_benchmarks("hpc", ruleset))
    except ValueError:
        allowed = []
    return sorted({*allowed, *OWN_RESULT_COUNTS})


def check_system_json(org_dir: Path, system: str) -> list[Finding]:
    """systems/<system>.json exists, is a JSON object and has every required field."""
    path = system_json_path(org_dir, system)
    if not path.is_file():
        return [error(path, RULE_SYSTEM_JSON, f"missing: results/{system} needs {path.name} in systems/")]
    try:
        desc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        return [error(path, RULE_SYSTEM_JSON, f"not UTF-8 text: {e.reason} at byte {e.start}")]
    except json.JSONDecodeError as e:
        return [error(path, RULE_SYSTEM_JSON, f"not valid JSON: {e.msg}", line=e.lineno)]
    except OSError as e:
        return [error(path, RULE_SYSTEM_JSON, f"cannot read: {e.strerror or e}")]
    if not isinstance(desc, dict):
        return [error(path, RULE_SYSTEM_JSON, "must hold a JSON object of system fields")]
    missing = [f for f in SYSTEM_REQUIRED_FIELDS if f not in desc]
    if missing:
        return [error(path, RULE_SYSTEM_JSON, f"missing required field(s): {', '.join(missing)}")]
    return []


def check_benchmark_name(entry: EntryDir, ruleset: str) -> list[Finding]:
    known = known_benchmarks(ruleset)
    if entry.benchmark in known:
        return []
    return [
        error(
            entry.path,
            RULE_BENCHMARK,
            f"no benchmark {entry.benchmark!r} in HPC ruleset {ruleset}; known: {', '.join(known)}",
        )
    ]


def check_run_count(entry: EntryDir) -> list[Finding]:
    """Strong: exactly the required number of result files; weak: at least that many."""
    required = required_run_count(entry.benchmark)
    found = len(entry.result_files)
    if required is None:
        return []  # check_benchmark_name reports it
    if entry.scaling == "strong" and found != required:
        message = f"{found} {RESULT_GLOB} file(s), strong scaling needs exactly {required}"
        return [error(entry.path, RULE_RUN_COUNT, message)]
    if entry.scaling == "weak" and found < required:
        message = f"{found} {RESULT_GLOB} file(s), weak scaling needs at least {required}"
        return [error(entry.path, RULE_RUN_COUNT, message)]
    return []


def check_stray_files(entry: EntryDir) -> list[Finding]:
    """Files that neither are results nor known extras (the official checker warns too)."""
    results = set(entry.result_files)
    stray = sorted(p.name for p in entry.path.iterdir() if p not in results and p.name not in ALLOWED_EXTRA)
    if not stray:
        return []
    message = f"unexpected file(s) {', '.join(stray)}; results must be named {RESULT_GLOB}"
    return [warning(entry.path, RULE_LAYOUT, message)]


def check_implementation(org_dir: Path, benchmark: str) -> list[Finding]:
    """benchmarks/<benchmark>/implementations/ should hold the code that produced the results."""
    folder = Path(org_dir) / "benchmarks" / benchmark / "implementations"
    if folder.is_dir():
        return []
    message = f"no {folder.relative_to(org_dir)}/ folder: add the code that produced these results"
    return [warning(folder, RULE_IMPLEMENTATION, message)]
