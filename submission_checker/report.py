"""The result of a check: one `EntryReport` per scored folder, in a `CheckReport`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlhpc.common.layout import Scaling

from .findings import Finding


@dataclass(frozen=True)
class RunReport:
    file: str
    """Result file, relative to the checked folder."""
    minutes: float | None
    """Time to train; None when run_start or run_stop is missing."""
    compliant: bool

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "minutes": self.minutes, "compliant": self.compliant}


@dataclass(frozen=True)
class EntryReport:
    """One results/<system>/<scaling>/<benchmark>/ folder, its runs, score and findings."""

    submitter: str
    system: str
    benchmark: str
    scaling: Scaling
    runs: tuple[RunReport, ...]
    score_raw_min: float | None
    """Strong: olympic mean of run times. Weak: minutes to train all counted models."""
    score_min: float | None
    """score_raw_min × rcp_scaling_factor."""
    models_per_min: float | None
    """Weak scaling only: counted models / score_raw_min."""
    findings: tuple[Finding, ...]
    rcp_scaling_factor: float = 1.0
    """RCP scaling factor (1.0 until the RCP check sets one); not in the JSON yet."""

    def to_json(self) -> dict[str, Any]:
        return {
            "submitter": self.submitter,
            "system": self.system,
            "benchmark": self.benchmark,
            "scaling": self.scaling,
            "runs": [r.to_json() for r in self.runs],
            "score_raw_min": self.score_raw_min,
            "score_min": self.score_min,
            "models_per_min": self.models_per_min,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class CheckReport:
    """Everything `check_submission` found; paths inside are relative to `root`."""

    root: str
    ruleset: str
    entries: tuple[EntryReport, ...]
    findings: tuple[Finding, ...] = field(default=())
    """Findings that belong to no entry (system descriptions, layout, implementations)."""

    def all_findings(self) -> Iterator[Finding]:
        yield from self.findings
        for entry in self.entries:
            yield from entry.findings

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.all_findings())

    def entry(self, system: str, scaling: str, benchmark: str, submitter: str | None = None) -> EntryReport:
        """The entry for one results folder; KeyError naming what exists when there is none."""
        for e in self.entries:
            if (e.system, e.scaling, e.benchmark) == (system, scaling, benchmark) and (
                submitter is None or e.submitter == submitter
            ):
                return e
        known = ", ".join(f"{e.system}/{e.scaling}/{e.benchmark}" for e in self.entries)
        raise KeyError(f"no entry {system}/{scaling}/{benchmark}; known: {known}")

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": [e.to_json() for e in self.entries],
            "findings": [f.to_dict() for f in self.findings],
        }
