"""Reference convergence points: the RCP decision of `mlperf_logging.rcp_checker`, in memory.

`RcpReader` reads a run's epochs-to-converge line by line as `read_submission_file` does;
`check_rcp` takes the decision of `check_directory` with the official RCP data and statistics
(olympic mean, one-sided t-test, interpolation, pruned set) but never writes `scaling.json`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

USAGE = "hpc"
NOT_CONVERGED_EPOCHS = 1e9  # what the official reader records for a run that did not converge
BYPASS_FILE = "package_checker_params"
BYPASS_LINE = "rcp-bypass"
MAX_PARAMS_BYTES = 4096

# The official messages (`check_directory`'s rcp_msg), kept verbatim so users can grep both tools.
MSG_FOUND = "RCP found"
MSG_INTERP = "RCP Interpolation"
MSG_SLOWER_SMALLER = "RCP not found but slower convergence on smaller batch size"
MSG_NONE = "Cannot find any RCPs"
MSG_NO_BS = "Could not detect global_batch_size"
MSG_NOT_CONVERGED = "Insufficient convergence"

Verdict = Literal["pass", "fail", "bypassed", "error", "smoke"]
"""smoke: a smoke configuration's batch size (our `mini` configs), for which no reference exists
or is meant to; the official package checker would reject it as a submission."""


@dataclass(frozen=True)
class RcpRead:
    """One result file as the official RCP reader sees it."""

    converged: bool
    epochs: float
    """epoch_num of the last eval line before the last successful run_stop; 1e9 if none."""
    batch_size: Any
    """Value of the last line mentioning global_batch_size; -1 when there is none."""
    benchmark: Any
    """Value of the last submission_benchmark line; None when there is none."""
    error: str | None = None
    """Why the official reader would raise on this file (then nothing else counts)."""


class RcpReader:
    """Feed it every `:::MLLOG` line's JSON text in order, then take `result()`.

    Mirrors `rcp_checker.read_submission_file` for HPC: the tests are substring tests on the
    JSON text, as there, so a line counts when the official reader would count it.
    """

    def __init__(self) -> None:
        self.converged = False
        self.epochs = NOT_CONVERGED_EPOCHS
        self.batch_size: Any = -1
        self.benchmark: Any = None
        self.conv_epoch: float | None = None
        self.error: str | None = None

    def feed(self, text: str, line: int, record: Any = None) -> None:
        """`text` is the JSON after `:::MLLOG `; `record` its decoding, when already done."""
        if self.error is not None:
            return
        try:
            self._feed(text, record)
        except Exception as e:  # the official reader raises here: the whole RCP check stops
            self.error = f"line {line}: {type(e).__name__}: {e}"

    def _feed(self, text: str, record: Any) -> None:
        wanted = ("global_batch_size", "submission_benchmark", "eval_error", "eval_accuracy", "run_stop")
        if not any(w in text for w in wanted):
            return
        data = json.loads(text) if record is None else record
        if "global_batch_size" in text:
            self.batch_size = data["value"]
        if "submission_benchmark" in text:
            self.benchmark = data["value"]
        if "eval_error" in text or "eval_accuracy" in text:
            self.conv_epoch = round(data["metadata"]["epoch_num"], 3)
        if "run_stop" in text and data["key"] == "run_stop":
            if data["metadata"]["status"] == "success":
                if self.conv_epoch is None:
                    raise ValueError("run_stop with status success before any eval line")
                self.converged, self.epochs = True, self.conv_epoch
            else:
                self.converged, self.epochs = False, NOT_CONVERGED_EPOCHS

    def result(self) -> RcpRead:
        return RcpRead(self.converged, self.epochs, self.batch_size, self.benchmark, self.error)


@dataclass(frozen=True)
class RcpResult:
    """The RCP decision for one entry, and the numbers behind it."""

    verdict: Verdict
    message: str
    """The official checker's message ("RCP found", "RCP Interpolation", ...) or why none."""
    batch_size: Any = None
    reference: str | None = None
    """Name of the RCP record compared against (`<bench>_interp_<bs>` when interpolated)."""
    rcp_mean: float | None = None
    min_epochs: float | None = None
    """Least acceptable mean epochs: RCP mean / max speedup."""
    submission_mean: float | None = None
    """Olympic mean of the runs' epochs to converge."""
    run_epochs: tuple[float, ...] = ()
    scaling_factor: float = 1.0
    """RCP mean / submission mean when the entry passes faster than the RCP mean, else 1."""
    evaluated: bool = False
    """The comparison ran (the official tool then rewrites or deletes scaling.json)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "message": self.message,
            "batch_size": self.batch_size,
            "reference": self.reference,
            "rcp_mean": self.rcp_mean,
            "min_epochs": self.min_epochs,
            "submission_mean": self.submission_mean,
            "scaling_factor": self.scaling_factor,
        }


@functools.cache
def _official_checker(ruleset: str, benchmark: str) -> Any:
    """The official RCP_Checker: it loads the data file and computes the statistics (no writes)."""
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker

    return RCP_Checker(USAGE, ruleset, benchmark, verbose=False)


def olympic_epochs(epochs: Sequence[float]) -> float:
    """Mean epochs without the fastest and the slowest run, as `_eval_submission_record`."""
    import numpy as np

    ordered = sorted(epochs)
    if len(ordered) <= 2:
        return math.nan  # numpy's mean of nothing, as the official code gets, without its warning
    return float(np.mean(ordered[1 : len(ordered) - 1]))


def _evaluate(record: dict[str, Any], epochs: Sequence[float]) -> tuple[bool, float, float]:
    """(passed, submission mean, scaling factor): `_eval_submission_record` without its writes."""
    mean = olympic_epochs(epochs)
    passed = bool(mean >= record["RCP Mean"] / record["Max Speedup"])
    factor = record["RCP Mean"] / mean if passed and mean < record["RCP Mean"] else 1.0
    return passed, mean, float(factor)


def _aggregate(reads: Sequence[RcpRead]) -> tuple[Any, Any, list[float] | None, str | None]:
    """(batch size, benchmark, epochs or None, error) as `get_submission_epochs` gathers them."""
    bs: Any = -1
    benchmark: Any = None
    for read in reads:
        if read.error is not None:
            return bs, benchmark, None, read.error
        if bs == -1:
            bs = read.batch_size
        elif read.batch_size != bs:
            return bs, benchmark, None, f"global_batch_size differs across runs ({bs} and {read.batch_size})"
        if benchmark is None:
            benchmark = read.benchmark
        elif read.benchmark != benchmark:
            return bs, benchmark, None, f"submission_benchmark differs ({benchmark} and {read.benchmark})"
    not_converged = sum(not r.converged for r in reads)
    epochs = None if not_converged > 1 else [r.epochs for r in reads]
    return bs, benchmark, epochs, None


def _find_reference(checker: Any, bs: Any) -> tuple[str, dict[str, Any] | None]:
    """The official record lookup of `check_directory` on the pruned RCPs: (message, record)."""
    pruned = "pruned_rcps"
    record = checker._find_rcp(bs, pruned)
    if record is not None:
        return MSG_FOUND, record
    low = checker._find_top_min_rcp(bs, pruned)
    high = checker._find_bottom_max_rcp(bs, pruned)
    if low is not None and high is not None:
        name, interp = checker._create_interp_rcp(bs, low, high)
        return MSG_INTERP, {**interp, "name": name}
    if low is None and high is not None:
        return MSG_SLOWER_SMALLER, checker._find_min_rcp(pruned)
    if low is not None:
        return f"Missing RCP, please submit RCP with BS = {bs}", None
    return MSG_NONE, None


def _record_name(checker: Any, record: dict[str, Any]) -> str:
    if "name" in record:
        return str(record["name"])
    for name, contents in checker.rcp_data.items():
        if contents is record:
            return str(name)
    return f"{record['Benchmark']}_bs{record['BS']}"


def check_rcp(reads: Sequence[RcpRead], ruleset: str, *, bypass: bool = False) -> RcpResult:
    """The RCP decision for one entry's runs, as `rcp_checker.check_directory` with the pruned set."""
    bs, benchmark, epochs, problem = _aggregate(reads)
    if problem is not None:
        return RcpResult("error", f"the official RCP checker stops here: {problem}", bs)
    try:
        checker = _official_checker(ruleset, benchmark)
    except Exception as e:
        return RcpResult("error", f"no RCP data for benchmark {benchmark!r} in HPC {ruleset} ({e!r})", bs)
    if bs == -1:
        return RcpResult("fail", MSG_NO_BS, bs)
    if epochs is None:
        return RcpResult("fail", MSG_NOT_CONVERGED, bs)
    logging.getLogger(__name__).debug("RCP check of %s bs=%s epochs=%s", benchmark, bs, epochs)
    try:
        message, record = _find_reference(checker, bs)
        if record is None:
            return _bypassed(RcpResult("fail", message, bs), bypass)
        passed, mean, factor = _evaluate(record, epochs)
    except Exception as e:  # e.g. a batch size that is not a number
        return RcpResult("error", f"the official RCP checker stops here: {type(e).__name__}: {e}", bs)
    if message == MSG_SLOWER_SMALLER and not passed:
        message = f"Missing RCP, please submit RCP with BS = {bs}"
    result = RcpResult(
        verdict="pass" if passed else "fail",
        message=message,
        batch_size=bs,
        reference=_record_name(checker, record),
        rcp_mean=float(record["RCP Mean"]),
        min_epochs=float(record["RCP Mean"] / record["Max Speedup"]),
        submission_mean=mean,
        run_epochs=tuple(epochs),
        scaling_factor=factor,
        evaluated=True,
    )
    return _bypassed(result, bypass)


def _bypassed(result: RcpResult, bypass: bool) -> RcpResult:
    """A failed check with a bypass file passes with review, as in the package checker."""
    bypassable = result.message in (MSG_FOUND, MSG_INTERP) or result.message.startswith("Missing RCP")
    if not (bypass and result.verdict == "fail" and bypassable):
        return result
    return RcpResult(**{**result.__dict__, "verdict": "bypassed"})


def has_bypass(folder: Path) -> bool:
    """`folder/package_checker_params` has a line that is exactly `rcp-bypass` (no newline)."""
    path = Path(folder) / BYPASS_FILE
    try:
        if not path.is_file() or path.stat().st_size > MAX_PARAMS_BYTES:
            return False
        with open(path, encoding="utf-8", errors="replace") as handle:
            return any(line == BYPASS_LINE for line in handle.readlines())
    except OSError:
        return False
