"""The result of a check: one `EntryReport` per scored folder, in a `CheckReport`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlhpc.common.layout import Scaling

from .findings import Finding
from .rcp import RcpResult


@dataclass(frozen=True)
class RunReport:
    file: str
    """Result file, relative to the checked folder."""
    minutes: float | None
    """Time to train; None when run_start or run_stop is missing."""
    compliant: bool
    dropped: str | None = None
    """Why the score leaves this run out: "fastest", "slowest", "not counted"; None if kept."""
    epochs: float | None = None
    """Epochs to converge as the RCP checker reads them (None when it did not converge)."""
    evals: tuple[tuple[float, float], ...] = ()
    """(epoch, eval metric) up to run_stop, for the convergence plot; not in the JSON."""
    achieved_flops_per_s: float | None = None
    """HPC AI500 benchmarks: training FLOP/s the run logged (None when it logged none)."""
    valid_flops: float | None = None
    """HPC AI500 benchmarks: Valid FLOPS the run logged (None when it logged none)."""
    loop_mode: str = "target"
    """'fixed_epochs': HPC AI500's mode, scored by Valid FLOPS (computed by the checker from the log:
    FLOPS over run_start..run_stop, times the quality penalty) instead of needing the target."""
    staging_s: float | None = None
    """staging_start to staging_stop in seconds; None when the log has no staging interval."""
    samples_per_s: float | None = None
    """Median `tracked_stats` throughput of the run (samples/s); None when it logged none."""
    nodes: int | None = None
    """number_of_nodes the run logged."""
    accelerators: int | None = None
    """Accelerators the run (one model) used: number_of_nodes × max(accelerators_per_node, 1)."""

    def to_json(self) -> dict[str, Any]:
        flops = (
            {}
            if self.valid_flops is None and self.achieved_flops_per_s is None
            else {
                "achieved_flops_per_s": self.achieved_flops_per_s,
                "valid_flops": self.valid_flops,
                "loop_mode": self.loop_mode,
            }
        )
        return {
            "file": self.file,
            "minutes": self.minutes,
            "compliant": self.compliant,
            "dropped": self.dropped,
            "epochs": self.epochs,
            **flops,
        }


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
    """The factor the official summarizer scores with (RCP check, else a scaling.json, else 1)."""
    division: str | None = None
    rcp: RcpResult | None = None
    """The RCP decision; None where the official tools take none (open division)."""
    num_models: int | None = None
    """Weak scaling: M, the compliant models counted."""
    instance_scale: int | None = None
    """Weak scaling: S, accelerators per model."""
    metric: str | None = None
    """The eval key the runs' convergence is measured by (eval_error, eval_accuracy)."""
    pruned_runs: tuple[RunReport, ...] = ()
    """Weak scaling: the instances under pruned_results/ (checked, never scored)."""
    energy_j: float | None = None
    """The official summarizer's energy (joules) from power/; None without power logs."""
    energy_total_j: float | None = None
    """Weak scaling: energy of all counted models together (joules)."""
    models_per_kwh: float | None = None
    """Weak scaling: counted models / energy_total_j in kWh."""

    @property
    def dropped_runs(self) -> int:
        return sum(r.dropped == "not counted" for r in self.runs)

    def mean_flops(self) -> tuple[float, float, int] | None:
        """HPC AI500: (mean achieved FLOP/s, mean Valid FLOPS, runs) over the compliant runs that
        logged both; None when none did (the MLPerf benchmarks log neither)."""
        runs = [
            r
            for r in self.runs
            if r.compliant and r.achieved_flops_per_s is not None and r.valid_flops is not None
        ]
        if not runs:
            return None
        n = len(runs)
        return (
            sum(r.achieved_flops_per_s or 0.0 for r in runs) / n,
            sum(r.valid_flops or 0.0 for r in runs) / n,
            n,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "submitter": self.submitter,
            "system": self.system,
            "benchmark": self.benchmark,
            "scaling": self.scaling,
            "division": self.division,
            "runs": [r.to_json() for r in self.runs],
            "score_raw_min": self.score_raw_min,
            "score_min": self.score_min,
            "rcp_scaling_factor": self.rcp_scaling_factor,
            "models_per_min": self.models_per_min,
            "num_models": self.num_models,
            "instance_scale": self.instance_scale,
            "rcp": None if self.rcp is None else self.rcp.to_json(),
            "pruned_runs": [r.to_json() for r in self.pruned_runs],
            "energy_j": self.energy_j,
            "energy_total_j": self.energy_total_j,
            "models_per_kwh": self.models_per_kwh,
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
    ruleset_reason: str = "--ruleset"
    """How the ruleset was chosen."""

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
            "ruleset": self.ruleset,
            "ruleset_reason": self.ruleset_reason,
            "entries": [e.to_json() for e in self.entries],
            "findings": [f.to_dict() for f in self.findings],
        }
