"""Per-file work: `parse_log` plus the official `mlperf_logging` compliance engine, over a pool.

The engine keeps module-level state (its queue of rule files), logs through the root logger,
re-reads its rule YAMLs for every file and strips each line with a regex that is quadratic in
the line's length. Each file runs with that queue emptied, those records dropped, the parsed
rules cached and the stripping done by an equal linear function (only while the installed one
is the known one). Files run in spawned worker processes when there are enough to pay for them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import importlib
import inspect
import logging
import multiprocessing
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.contract import catalog
from mlhpc.common.errors import SubmissionError
from mlhpc.common.safeio import safe_read
from mlhpc.common.vocabulary import DEFAULT_RULESET as DEFAULT_RULESET  # the checker's name for it

from .logparse import RunLog, find_line, parse_log

USAGE = "hpc"
# Below this many files, starting worker processes costs more than it saves (measured on
# 2 cores with the rule cache: 200 files 1.7 s serial vs 1.9 s pooled; a 1,079-file round
# 12.3 s vs 7.1 s).
MIN_FILES_FOR_POOL = 300
# The largest published HPC result log is 1.3 MB; a file this big is not a log, and the engine
# would read all of it into memory.
MAX_RESULT_BYTES = 32 * 2**20

_log = logging.getLogger(__name__)
_FAILED_IN_LINE = re.compile(r"failed in line (\d+)")


@dataclass(frozen=True)
class ComplianceMessage:
    line: int | None
    """1-based file line the engine's message points at, when it names one."""
    text: str


@dataclass(frozen=True)
class LogAnalysis:
    """Everything the checker learns from one result file."""

    path: str
    compliant: bool
    """The official engine passed it and every `:::MLLOG` line decoded (the summarizer's test), with
    no impossible time in it."""
    messages: tuple[ComplianceMessage, ...]
    """The engine's messages, shortened; a crash of the engine is one of them."""
    log: RunLog | None
    """None when the file was not read (then `refused` or `messages` says why)."""
    refused: tuple[str, str, str] | None = None
    """(rule, message, fix) when the file was not checked: too big, not a file, a link out, a huge line."""


def known_rulesets() -> list[str]:
    """The HPC rulesets the installed mlperf_logging has rule files for."""
    import mlperf_logging.compliance_checker as cc

    folder = Path(cc.__file__).parent
    return sorted(p.name.split("_", 1)[1] for p in folder.glob(f"{USAGE}_*.*.*") if p.is_dir())


def validate_ruleset(ruleset: str) -> str:
    known = known_rulesets()
    if ruleset not in known:
        raise SubmissionError(f"unknown HPC ruleset {ruleset!r}; known: {', '.join(known)}")
    return ruleset


class _DropEngineRecords(logging.Filter):
    """Drops the engine's own log records (it prints every message it collects)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "mlperf_logging" not in record.pathname


class _CachedYaml:
    """Stands in for the engine's `yaml` module: each rule file is parsed once per process.

    The engine parses its rule YAMLs again for every log (85% of its time); the rules are the
    installed files, so a copy of the first parse is the same input.
    """

    def __init__(self, real: Any) -> None:
        self._real = real
        self._parsed: dict[tuple[str, Any], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load(self, stream: Any, Loader: Any) -> Any:
        name = getattr(stream, "name", None)
        if not isinstance(name, str):
            return self._real.load(stream, Loader=Loader)
        key = (name, Loader)
        if key not in self._parsed:
            self._parsed[key] = self._real.load(stream, Loader=Loader)
        return copy.deepcopy(self._parsed[key])


_YAML_CACHE: _CachedYaml | None = None
# sha256 of the source of `strip_and_dedup` in mlperf_logging's mlp_parser modules (4.1.68).
KNOWN_STRIP_AND_DEDUP = "f4dbd684fce2585bb501d02357cabdb6668f9b6ac3d6732db72ffe47886e7b5b"
MLLOG_TOKEN = ":::MLLOG "


def strip_and_dedup(lines: Iterator[str]) -> list[str]:
    """The engine's `re.sub(".*" + TOKEN, TOKEN, line)` for each line holding the token, in linear time.

    For a line read from a file (its only newline at the end) the greedy `.*` ends at the last
    token, and nothing after it matches again: the result is the token plus what follows its
    last occurrence. The regex takes seconds on a 30 kB line and 0.1 s on a 600 kB log.
    """
    return [
        MLLOG_TOKEN + line[line.rindex(MLLOG_TOKEN) + len(MLLOG_TOKEN) :]
        for line in lines
        if MLLOG_TOKEN in line
    ]


@functools.cache
def _parser_module(ruleset: str) -> Any | None:
    """mlp_parser's module for `ruleset` when its strip_and_dedup is the known one, else None."""
    try:
        module = importlib.import_module(
            f"mlperf_logging.compliance_checker.mlp_parser.ruleset_{ruleset.replace('.', '')}"
        )
        source = inspect.getsource(module.strip_and_dedup)
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return module if hashlib.sha256(source.encode()).hexdigest() == KNOWN_STRIP_AND_DEDUP else None


@contextlib.contextmanager
def _engine_context(ruleset: str) -> Iterator[Any]:
    """The engine module with an empty queue, cached rules, linear stripping, no log records."""
    global _YAML_CACHE
    from mlperf_logging.compliance_checker import mlp_compliance

    parser = _parser_module(ruleset)
    real_strip = None if parser is None else parser.strip_and_dedup
    real_yaml = mlp_compliance.yaml
    if _YAML_CACHE is None:
        _YAML_CACHE = _CachedYaml(real_yaml)
    root = logging.getLogger()
    # A root handler stops logging.warning() from calling basicConfig() behind our back.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    drop = _DropEngineRecords()
    root.addFilter(drop)
    mlp_compliance.enqueued_configs.clear()
    mlp_compliance.yaml = _YAML_CACHE
    if parser is not None:
        parser.strip_and_dedup = strip_and_dedup
    try:
        yield mlp_compliance
    finally:
        if parser is not None:
            parser.strip_and_dedup = real_strip
        mlp_compliance.yaml = real_yaml
        mlp_compliance.enqueued_configs.clear()
        root.removeFilter(drop)
        if guard is not None:
            root.removeHandler(guard)


def _shorten(message: str, path: str, log: RunLog | None) -> ComplianceMessage:
    """One engine message without its context dumps, pointed at the file line it names."""
    kept: list[str] = []
    quoted: str | None = None
    for text in message.strip().splitlines():
        if text.startswith("current context") or text.startswith("current line"):
            break
        if text.startswith(":::MLLOG"):
            quoted = quoted or text
            continue
        kept.append(text.strip())
    line: int | None = None
    found = _FAILED_IN_LINE.search(message)
    if found and log is not None and int(found.group(1)) < len(log.mllog_lines):
        line = log.mllog_lines[int(found.group(1))]
    elif quoted is not None:
        line = find_line(path, quoted)
    text = " ".join(t for t in kept if t)
    text = _FAILED_IN_LINE.sub("failed", text).replace(": failed test:", "; failed test:")
    return ComplianceMessage(line, " ".join(text.split()))


def own_rules(benchmark: str | None) -> Path | None:
    """The rule file the catalog gives for `benchmark`, or None for mlperf_logging's own rules."""
    found = catalog.find(benchmark) if benchmark is not None else None
    if found is None or found.rules_file is None:
        return None
    if not found.rules_file.is_file():
        raise SubmissionError(
            f"the rule file {found.rules_file} of {benchmark} is not installed; reinstall its package"
        )
    return found.rules_file.resolve()


def run_engine(path: str, ruleset: str, log: RunLog | None = None) -> tuple[bool, list[ComplianceMessage]]:
    """Run the official checker on one file: (passed, its messages).

    Logs of this project's own benchmarks run under their shipped rule file (an absolute path,
    which the engine takes as it is); the others under `hpc_<ruleset>/common.yaml`.
    """
    try:
        rules = own_rules(log.benchmark if log is not None else None)
    except SubmissionError as e:
        return False, [ComplianceMessage(None, str(e))]
    config = str(rules) if rules is not None else f"{USAGE}_{ruleset}/common.yaml"
    with _engine_context(ruleset) as engine:
        checker = engine.make_checker(USAGE, ruleset, quiet=True, werror=False)
        try:
            valid = checker.check_file(path, config)
        except Exception as e:  # the engine raises on some malformed records; that is a finding
            text = f"the official compliance checker stopped on this file: {type(e).__name__}: {e}"
            return False, [ComplianceMessage(None, text)]
    raw = [*checker.overwritable.values(), *checker.not_overwritable]
    return bool(valid), [_shorten(m, path, log) for m in raw]


def refusal(path: str) -> tuple[str, str, str] | None:
    """Why `path` must not be read (not a regular file, or too big), or None: `safe_read`'s answer
    under the checker's rules and fixes."""
    found = safe_read.refusal(path, MAX_RESULT_BYTES, what="a result log")
    if found is None:
        return None
    if found.kind == "too-big":
        return (
            "file-size",
            f"{found.reason}; not read",
            "keep only the :::MLLOG lines of rank 0 in the result file",
        )
    fix = (
        "replace it with the text log of the run" if found.kind == "not-a-file" else "make it a readable file"
    )
    return ("log-parse", found.reason, fix)


def analyse_log(path: str, ruleset: str) -> LogAnalysis:
    """Parse one result file and run the official compliance checker on it; never raises."""
    refused = refusal(path)
    if refused is not None:
        return LogAnalysis(path, False, (), None, refused)
    try:
        log = parse_log(path)
    except OSError as e:
        message = ComplianceMessage(None, f"cannot read the file: {e.strerror or e}")
        return LogAnalysis(path, False, (message,), None)
    except Exception as e:  # a hostile file must become a finding, not a crash of the whole check
        message = ComplianceMessage(None, f"cannot parse the file: {type(e).__name__}: {e}")
        return LogAnalysis(path, False, (message,), None)
    if log.long_line is not None:
        line, chars = log.long_line
        message = (
            f"line {line} has {chars} characters; the official checker's parser takes minutes "
            "on such lines, so the file is not checked"
        )
        return LogAnalysis(
            path, False, (), log, ("log-parse", message, "keep :::MLLOG lines short (one event each)")
        )
    valid, messages = run_engine(path, ruleset, log)
    compliant = valid and not log.parse_errors and not log.impossible
    return LogAnalysis(path, compliant, tuple(messages), log)


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def analyse_logs(
    paths: Sequence[Path | str],
    ruleset: str,
    jobs: int | None = None,
    *,
    min_files_for_pool: int = MIN_FILES_FOR_POOL,
) -> dict[str, LogAnalysis]:
    """`analyse_log` for every path, in spawned worker processes when it pays; keyed by path.

    A script calling this (or `check_submission`) with more than one job must do so under
    `if __name__ == "__main__":`, as for any spawned pool; if the workers fail it runs serially.
    """
    names = [str(p) for p in paths]
    workers = min(jobs or _default_jobs(), len(names))
    if workers <= 1 or len(names) < min_files_for_pool:
        return {name: analyse_log(name, ruleset) for name in names}
    chunk = max(1, len(names) // (workers * 4))
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(analyse_log, names, [ruleset] * len(names), chunksize=chunk))
    except concurrent.futures.process.BrokenProcessPool as e:
        # Typically a script that calls us without `if __name__ == "__main__":` (spawn re-runs it).
        _log.warning("compliance worker processes failed (%s); checking in this process", e)
        return {name: analyse_log(name, ruleset) for name in names}
    return dict(zip(names, results, strict=True))
