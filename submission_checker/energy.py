"""Energy to train from `power/result_<i>/node_*.txt` and `sw_*.txt`, as the official summarizer scores it.

The arithmetic is mlperf_logging.result_summarizer's (`_compute_power_node`, `_compute_power_sw`,
the olympic averages; tests/helpers/upstream.py guards their source), redone on files read
through safe_read, where a bad file is a finding instead of a crash. Node files: the readings between
power_measurement_start and power_measurement_stop, each times the time since the one before,
scaled to the run's time to train. Switch files: interconnect_power_est × time to train. Joules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.common.safeio import safe_read

from .findings import RULE_ENERGY, RULE_IMPOSSIBLE, Finding, error, warning
from .logparse import TOKEN, decode_mllog
from .scoring import MAX_DROPPED_RUNS, RunTiming

POWER_DIR = "power"
# A day of 1 Hz readings is 20 MB; a power log bigger than this is not one.
MAX_POWER_LOG_BYTES = 256 * 2**20
MAX_SAMPLE_GAP_MS = 1000.0
"""Training power rules: at least one reading per second per node."""
J_PER_KWH = 3.6e6
FIX = "write power/result_<i>/node_<n>.txt as the MLPerf power logging does (mllog power keys)"


# A switch estimate of a megawatt, or a conversion efficiency above 1, is a damaged or forged log.
MAX_WATTS = 1e6
MIN_NODE_WATTS = 1.0
"""A powered node draws more: its BMC and fans alone take watts (a training node, hundreds)."""
MAX_NODE_WATTS = 20e3
"""One node's reading: NVIDIA's DGX B200, the largest node class in MLPerf rounds so far, is
specified at 14.3 kW maximum (DGX H100: 10.2 kW); 20 kW leaves headroom and no single node."""
MIN_CONVERSION_EFF = 0.5
"""80 PLUS, the lowest power-supply certification, asks 0.80 at 20-100 % load; 0.5 leaves room
for a whole chain (UPS, PDU, supply) and still refuses an efficiency that multiplies energy away."""
MAX_POWER_TIME_MS = 1e13
"""As the result logs' time_ms: milliseconds since 1970, before the year 2286."""


class EnergyError(ValueError):
    """A power log the summarizer's arithmetic cannot score; the message says why."""

    def __init__(self, message: str, line: int | None = None, *, impossible: bool = False) -> None:
        super().__init__(message)
        self.line = line
        self.impossible = impossible
        """A value no measurement gives: an error finding, not only a missing energy."""


@dataclass(frozen=True)
class PowerRecord:
    key: str
    time_ms: float
    value: Any
    line: int


def read_power_log(path: Path) -> list[PowerRecord]:
    """The power keys of one log; EnergyError (or OSError) when it cannot be read or decoded."""
    wanted = {"power_measurement_start", "power_measurement_stop", "power_reading", "conversion_eff"}
    wanted.add("interconnect_power_est")
    records: list[PowerRecord] = []
    with safe_read.open_text(path, MAX_POWER_LOG_BYTES, what="a power log") as handle:
        for number, text in enumerate(handle, start=1):
            if TOKEN not in text:
                continue
            try:
                record = decode_mllog(text)
            except ValueError:
                continue  # the official parser drops such lines too
            if record["key"] in wanted:
                records.append(PowerRecord(record["key"], record["time_ms"], record["value"], number))
    return records


def _number(record: PowerRecord) -> float:
    value = record.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EnergyError(f"{record.key} value {value!r} is not a number", record.line)
    if not math.isfinite(value):
        raise EnergyError(
            f"{record.key} value {value!r} is not a finite number", record.line, impossible=True
        )
    return float(value)


def _impossible(record: PowerRecord, message: str) -> EnergyError:
    return EnergyError(message, record.line, impossible=True)


def _check_watts(r: PowerRecord, kind: str) -> None:
    watts = _number(r)
    low, high = (MIN_NODE_WATTS, MAX_NODE_WATTS) if kind == "node" else (0.0, MAX_WATTS)
    if not low <= watts <= high:
        unit = "a node" if kind == "node" else "an interconnect estimate"
        sign = "a negative " if watts < 0 else ""  # the commonest forgery, named as such
        raise _impossible(
            r, f"{sign}{r.key} of {watts!r} W is outside {low:g}..{high:g} W, which {unit} draws"
        )


def check_possible(records: Sequence[PowerRecord], kind: str = "node") -> None:
    """EnergyError (impossible=True) naming the first line no measurement gives: a time that is not
    finite, negative or past 2286, power outside what one node draws (MIN/MAX_NODE_WATTS; for a
    switch log 0..MAX_WATTS), an efficiency outside MIN_CONVERSION_EFF..1, a second
    power_measurement_start or stop (a log holds one measurement), a stop before its start."""
    start: PowerRecord | None = None
    stop: PowerRecord | None = None
    for r in records:
        if not math.isfinite(r.time_ms) or not 0 <= r.time_ms <= MAX_POWER_TIME_MS:
            raise _impossible(r, f"{r.key} at time_ms={r.time_ms!r}, which no clock gives")
        if r.key in ("power_reading", "interconnect_power_est"):
            _check_watts(r, kind)
        if r.key == "conversion_eff" and not MIN_CONVERSION_EFF <= _number(r) <= 1:
            raise _impossible(
                r, f"conversion_eff={r.value!r} is not an efficiency in {MIN_CONVERSION_EFF:g}..1"
            )
        if r.key in ("power_measurement_start", "power_measurement_stop"):
            first = start if r.key == "power_measurement_start" else stop
            if first is not None:
                raise _impossible(
                    r, f"a second {r.key} (the first on line {first.line}): one measurement a log"
                )
            start, stop = (r, stop) if r.key == "power_measurement_start" else (start, r)
        if r.key == "power_measurement_stop" and start is not None and r.time_ms < start.time_ms:
            raise _impossible(
                r, f"power_measurement_stop is before power_measurement_start (line {start.line})"
            )


def node_energy_j(records: Sequence[PowerRecord], time_to_train_ms: float) -> float:
    """`_compute_power_node`: integrated readings scaled to the time to train."""
    prev = last = start = stop = 0.0
    total, eff = 0.0, 1.0
    started = stopped = False
    for r in sorted(records, key=lambda r: r.time_ms):  # stable, as the summarizer's list.sort
        if r.key == "power_measurement_start":
            start = prev = r.time_ms
            started = True
        if r.key == "power_reading" and not stopped and started:
            total += _number(r) * (r.time_ms - prev)
            prev = r.time_ms
            last = max(last, r.time_ms)
        if r.key == "power_measurement_stop":
            stop, stopped = r.time_ms, True
        if r.key == "conversion_eff":
            eff = _number(r)
    if not started:
        raise EnergyError("no power_measurement_start")
    if not stopped:
        stop = last
    if stop == start:
        raise EnergyError("power_measurement_stop is at power_measurement_start: no time measured")
    return eff * total * time_to_train_ms / (stop - start) / 1000


def sw_energy_j(records: Sequence[PowerRecord], time_to_train_ms: float) -> float:
    """`_compute_power_sw`: the first interconnect_power_est × the time to train."""
    power, eff = 0.0, 1.0
    for r in records:
        if r.key == "conversion_eff":
            eff = _number(r)
        if r.key == "interconnect_power_est":
            power = _number(r)
            break
    return eff * power * time_to_train_ms / 1000


def _sample_findings(path: Path, records: Sequence[PowerRecord]) -> list[Finding]:
    times = sorted(r.time_ms for r in records if r.key == "power_reading")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps or max(gaps) <= MAX_SAMPLE_GAP_MS:
        return []
    message = f"readings {max(gaps):.0f} ms apart; the power rules want one a second per node"
    return [warning(path, RULE_ENERGY, message, fix="sample power at least once a second")]


def _possible_energy(joules: float, kind: str) -> float:
    """`joules` when a run can have used it: finite, and more than nothing for a node."""
    if not math.isfinite(joules) or joules < 0 or (kind == "node" and joules == 0):
        raise EnergyError(f"the readings add up to {joules!r} J, which no run uses", impossible=True)
    return joules


def _energy_finding(path: Path, e: EnergyError) -> Finding:
    if e.impossible:
        fix = "rerun with working power meters, or restore the log as the meter wrote it"
        return error(path, RULE_IMPOSSIBLE, f"{e}; the run's energy is not scored", e.line, fix=fix)
    return warning(path, RULE_ENERGY, f"no energy: {e}", e.line, fix=FIX)


def system_nodes(fields: dict[str, Any] | None) -> int | None:
    """number_of_nodes of a systems JSON as a positive int, or None when it says none."""
    value = None if fields is None else fields.get("number_of_nodes")
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip()) if len(value.strip()) < 10 else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_energy_j(
    entry_path: Path, result_file: str, time_to_train_ms: float, system_node_count: int | None = None
) -> tuple[float | None, list[Finding]]:
    """Energy of one run (all its node and switch logs), or None with the finding that says why;
    more node logs than the system's `system_node_count` is an error (a node twice, or forged)."""
    name = Path(result_file).name.split(".")[0]
    folder = entry_path / POWER_DIR / name
    why = safe_read.link_out(folder, entry_path)
    if why is not None:
        return None, [
            warning(folder, RULE_ENERGY, f"{why}; not read", fix="copy the power logs into the entry")
        ]
    nodes, refused = safe_read.find_files(folder, "node_*.txt", MAX_POWER_LOG_BYTES, what="a power log")
    switches, refused_sw = safe_read.find_files(folder, "sw_*.txt", MAX_POWER_LOG_BYTES, what="a power log")
    findings = [
        warning(p, RULE_ENERGY, f"{why.reason}; not read", fix=why.fix) for p, why in refused + refused_sw
    ]
    if not nodes:
        return None, [*findings, warning(folder, RULE_ENERGY, f"no node_*.txt power log for {name}", fix=FIX)]
    if system_node_count is not None and len(nodes) > system_node_count:
        message = (
            f"{len(nodes)} node power logs for {name}, but the system has {system_node_count} nodes "
            "(systems JSON number_of_nodes); the run's energy is not scored"
        )
        fix = "keep one node_<n>.txt per node the run used"
        return None, [*findings, error(folder, RULE_IMPOSSIBLE, message, fix=fix)]
    total = 0.0
    for path, kind in [*((p, "node") for p in nodes), *((p, "sw") for p in switches)]:
        try:
            records = read_power_log(path)
            check_possible(records, kind)
            energy = node_energy_j if kind == "node" else sw_energy_j
            total += _possible_energy(energy(records, time_to_train_ms), kind)
        except EnergyError as e:
            return None, [*findings, _energy_finding(path, e)]
        except OSError as e:
            reason = e.strerror or str(e)
            return None, [*findings, warning(path, RULE_ENERGY, f"no energy: {reason}", fix=FIX)]
        if kind == "node":
            findings += _sample_findings(path, records)
    return total, findings


@dataclass(frozen=True)
class EntryEnergy:
    energy_j: float | None
    """The summarizer's energy column: strong, the olympic mean (by time) × RCP factor; weak,
    the mean per-model energy without the lowest."""
    total_j: float | None = None
    """Weak scaling: energy of all counted models together."""
    models_per_kwh: float | None = None


def entry_energy(
    entry_path: Path,
    runs: Sequence[RunTiming],
    scaling: str,
    factor: float,
    system_node_count: int | None = None,
) -> tuple[EntryEnergy | None, list[Finding]]:
    """None when the entry has no power/ folder (the summarizer then has no energy column);
    `system_node_count` (systems JSON number_of_nodes) bounds each run's node logs."""
    if not (entry_path / POWER_DIR).is_dir():
        return None, []
    findings: list[Finding] = []
    scores: list[float] = []
    energies: list[float] = []
    counted = [r for r in runs if r.counts and r.run_start_ms is not None and r.run_stop_ms is not None]
    for run in counted:
        ttt_ms = run.run_stop_ms - run.run_start_ms  # type: ignore[operator]
        energy, problems = run_energy_j(entry_path, run.file, ttt_ms, system_node_count)
        findings += problems
        if energy is None:
            return EntryEnergy(None), findings
        scores.append(ttt_ms / 60 / 1000)
        energies.append(energy)
    if scaling == "weak":
        rest = sorted(energies)[1:]
        mean = sum(rest) * 1.0 / len(rest) if rest else None
        total = sum(energies) if energies else None
        per_kwh = len(energies) / (total / J_PER_KWH) if total else None
        return EntryEnergy(mean, total, per_kwh), findings
    dropped = len(runs) - len(counted)
    if dropped > MAX_DROPPED_RUNS:
        return EntryEnergy(None), findings
    order = [i for i, _ in sorted(enumerate(scores), key=lambda x: x[1])]
    kept = [energies[i] for i in order][MAX_DROPPED_RUNS : len(energies) - (MAX_DROPPED_RUNS - dropped)]
    mean = sum(kept) * 1.0 / len(kept) * factor if kept else None
    return EntryEnergy(mean), findings
