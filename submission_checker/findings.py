"""The `Finding` record every check returns, and the rule names they use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Severity = Literal["error", "warning"]

# Rule names, one per check, so that a user can grep for them and a test can assert on them.
RULE_SYSTEM_JSON = "system-json"
RULE_LAYOUT = "layout"
RULE_SYMLINK = "symlink"
RULE_BENCHMARK = "benchmark-unknown"
RULE_IMPLEMENTATION = "implementation-missing"
RULE_RUN_COUNT = "run-count"
RULE_LOG_PARSE = "log-parse"
RULE_FILE_SIZE = "file-size"
RULE_RUN_START_STOP = "run-start-stop"
RULE_RUN_STATUS = "run-status"
RULE_TIMESTAMPS = "timestamps"
RULE_COMPLIANCE = "compliance"
RULE_SEED = "seed-duplicate"
RULE_SEED_MISSING = "seed-missing"
RULE_RUN_SCALE = "run-scale"
RULE_INSTANCE_SCALE = "instance-scale"
RULE_RCP = "rcp"
RULE_SCALING_JSON = "scaling-json"
RULE_SCORE = "score"
RULE_PRUNED = "pruned-log"
RULE_SEED_PRUNED = "seed-pruned"
RULE_SCALE_CLAIM = "scale-claim"
RULE_LOG_SYSTEM = "log-vs-system"
RULE_ENERGY = "energy"
RULE_IMPOSSIBLE = "impossible-value"
"""A number no measurement gives (negative or non-finite power, energy or time, a stop before its
start, an absurd magnitude): an error, and never part of a score."""


@dataclass(frozen=True)
class Finding:
    """One problem found in a submission: where it is, which rule found it, and what to do."""

    severity: Severity
    """"error" (the submission would be rejected or not scored) or "warning" (a reviewer looks)."""
    path: str
    """The file or folder at fault, relative to the checked folder once in a report."""
    line: int | None
    """1-based line in `path`, or None when the finding is about the whole file or folder."""
    rule: str
    """One of the RULE_* names above."""
    message: str
    """What is wrong, in one line."""
    fix: str = ""
    """What would fix it, in one line ("" when the message says it all)."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def relative_to(self, root: Path) -> Finding:
        """The same finding with `path` made relative to `root` when it lies under it."""
        try:
            rel = Path(self.path).relative_to(root)
        except ValueError:
            return self
        return Finding(self.severity, rel.as_posix() or ".", self.line, self.rule, self.message, self.fix)

    @property
    def where(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"

    def format(self) -> str:
        """`severity path:line rule: message; fix: ...`, the form the CLI prints."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.severity} {self.where} {self.rule}: {self.message}{fix}"


def error(path: Path | str, rule: str, message: str, line: int | None = None, fix: str = "") -> Finding:
    return Finding("error", str(path), line, rule, message, fix)


def warning(path: Path | str, rule: str, message: str, line: int | None = None, fix: str = "") -> Finding:
    return Finding("warning", str(path), line, rule, message, fix)


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
