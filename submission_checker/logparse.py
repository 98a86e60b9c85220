"""Read the facts the checker needs from one `:::MLLOG` result file, with real line numbers.

Lines are picked and decoded the way `mlperf_logging`'s parser does it (latin-1, any line holding
`:::MLLOG `, text from its last occurrence), so times match the official result summarizer's and
the RCP reader sees what the official one sees.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.common.log_keys import ACHIEVED_FLOPS, FLOPS_PER_SAMPLE, LOOP_MODE, VALID_FLOPS, VFLOPS_EXPONENT
from mlhpc.common.safeio import safe_read

from .rcp import RcpRead, RcpReader

TOKEN = ":::MLLOG "
EVAL_KEYS = ("eval_error", "eval_accuracy")
# A plot needs no more; a log with more eval lines than this is broken anyway.
MAX_EVAL_POINTS = 5_000
# The official parser's regex takes quadratic time in the length of a `:::MLLOG` line (30 KB: half
# a second, 1 MB: minutes); the longest line in the published HPC rounds has 410 characters.
MAX_MLLOG_LINE_CHARS = 16 * 1024
# How far `sniff_log` reads looking for run_start (real logs have it within the first 100 lines).
SNIFF_BYTES = 256 * 1024
# time_ms is milliseconds since 1970: a negative one, or one past this (the year 2286), is no
# clock's reading but a damaged or forged line.
MAX_TIME_MS = 1e13


@dataclass(frozen=True)
class RunLog:
    """What one result file says about its run; every line number is 1-based in the file."""

    path: str
    mllog_lines: tuple[int, ...]
    """File line of each `:::MLLOG` line, in order: index i is the engine's `lineno` i."""
    parse_errors: tuple[tuple[int, str], ...]
    """(line, what is wrong) for each `:::MLLOG` line that does not decode."""
    binary: bool
    """The file holds NUL bytes: not a text log."""
    run_start_ms: float | None
    run_start_line: int | None
    run_stop_ms: float | None
    run_stop_line: int | None
    run_stop_status: str | None
    """`metadata.status` of the run_stop used for timing; None when not logged."""
    seeds: tuple[tuple[str, int], ...]
    """(seed value as JSON text, line) for each `seed` line."""
    number_of_nodes: Any = None
    accelerators_per_node: Any = None
    benchmark: str | None = None
    """Value of the first `submission_benchmark` line."""
    division: str | None = None
    """Value of the first `submission_division` line."""
    global_batch_size: Any = None
    staging_before_run_start: bool = False
    """staging_start comes before run_start (allowed from HPC 3.0.0 on)."""
    backwards: tuple[int, int] | None = None
    """(how many lines, first line) whose time_ms is earlier than the line before."""
    evals: tuple[tuple[str, float, float], ...] = ()
    """(key, epoch_num, value) of each eval_error / eval_accuracy line up to run_stop."""
    rcp: RcpRead = field(default_factory=lambda: RcpReader().result())
    """Epochs to converge and batch size as the official RCP checker reads them."""
    long_line: tuple[int, int] | None = None
    """(line, characters) of the first `:::MLLOG` line longer than MAX_MLLOG_LINE_CHARS."""
    achieved_flops_per_s: float | None = None
    """Value of the first `achieved_flops_per_s` line (HPC AI500 benchmarks), if a finite number."""
    valid_flops: float | None = None
    """Value of the first `valid_flops` line (HPC AI500's Valid FLOPS), if a finite number."""
    loop_mode: str = "target"
    """Value of the first `loop_mode` line ('target' when the log has none)."""
    flops_per_sample: float | None = None
    """Value of the first `flops_per_sample` line, if a finite number."""
    vflops_exponent: float | None = None
    """Value of the first `vflops_exponent` line (HPC AI500's n), if a finite number."""
    train_samples: float | None = None
    """Value of the first `train_samples` line, if a finite number."""
    submitter: Any = None
    """Value of the first `submission_org` line (MLPerf's name for the submitter)."""
    system: Any = None
    """Value of the first `submission_platform` line (MLPerf's name for the system)."""
    status: Any = None
    """Value of the first `submission_status` line."""
    staging_ms: float | None = None
    """First staging_stop minus the staging_start before it; None when the log has no such pair."""
    throughputs: tuple[float, ...] = ()
    """`tracked_stats` throughput values (samples/s of the run) up to run_stop, in log order."""
    impossible: tuple[tuple[int, str], ...] = ()
    """(line, what) for each line whose time_ms no clock gives (not finite, negative, absurd);
    such a line counts for nothing (not as run_start, run_stop or anything else)."""

    @property
    def has_start_stop(self) -> bool:
        return self.run_start_ms is not None and self.run_stop_ms is not None

    @property
    def instance_scale(self) -> int | None:
        """Accelerators one model uses: number_of_nodes × max(accelerators_per_node, 1)."""
        try:
            return int(self.number_of_nodes) * max(int(self.accelerators_per_node), 1)
        except (TypeError, ValueError, OverflowError):
            return None


@dataclass(frozen=True)
class LogSniff:
    """The little `detect_ruleset` needs, read from the head of a file."""

    benchmark: str | None
    run_start_ms: float | None
    staging_before_run_start: bool


def json_part(text: str) -> str | None:
    """The JSON text after the last `:::MLLOG ` in a line, or None when nothing follows it."""
    line = text[text.rindex(TOKEN) :].strip()
    return line[len(TOKEN) :] if line.startswith(TOKEN) else None


def _load(part: str) -> Any:
    try:
        return json.loads(part)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON after ':::MLLOG': {e}") from e
    except RecursionError as e:
        raise ValueError("the JSON after ':::MLLOG' is nested too deeply") from e


def _validate(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError("the JSON after ':::MLLOG' is not an object")
    missing = [k for k in ("time_ms", "key", "value", "metadata") if k not in record]
    if missing:
        raise ValueError(f"the record lacks {', '.join(missing)}")
    try:
        time_ms = float(record["time_ms"])
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"time_ms={record['time_ms']!r} is not a number") from e
    return {**record, "time_ms": time_ms}


def impossible_time(time_ms: float) -> str | None:
    """Why `time_ms` cannot be a logged time (milliseconds since 1970), or None when it can."""
    if not math.isfinite(time_ms):
        return f"time_ms={time_ms!r} is not a finite number"
    if time_ms < 0:
        return f"time_ms={time_ms!r} is negative (before 1970)"
    if time_ms > MAX_TIME_MS:
        return f"time_ms={time_ms:.4g} is after the year 2286"
    return None


def decode_mllog(text: str) -> dict[str, Any]:
    """Decode one line that holds `:::MLLOG `; raise ValueError saying what is wrong."""
    part = json_part(text)
    if part is None:
        raise ValueError("nothing after ':::MLLOG'")
    return _validate(_load(part))


class _Collector:
    """State of one pass over a log; `parse_log` feeds it decoded records."""

    def __init__(self) -> None:
        self.start: tuple[float, int] | None = None
        self.stop: tuple[float, int, str | None] | None = None
        self.first: dict[str, Any] = {}
        self.seeds: list[tuple[str, int]] = []
        self.evals: list[tuple[str, float, float]] = []
        self.staging_first = False
        self.staging: tuple[float | None, float | None] = (None, None)
        self.throughputs: list[float] = []
        self.last_ms = float("-inf")
        self.backwards = 0
        self.backwards_line: int | None = None

    def add(self, record: dict[str, Any], number: int) -> None:
        key, metadata, time_ms = record["key"], record["metadata"], record["time_ms"]
        if time_ms < self.last_ms:
            self.backwards += 1
            self.backwards_line = self.backwards_line or number
        self.last_ms = time_ms
        # As mlperf_logging's result summarizer: take run_start/run_stop until both are seen.
        if self.start is None or self.stop is None:
            if key == "run_start":
                self.start = (time_ms, number)
            elif key == "run_stop":
                status = metadata.get("status") if isinstance(metadata, dict) else None
                self.stop = (time_ms, number, None if status is None else str(status))
        if key == "staging_start" and self.start is None:
            self.staging_first = True
        self._staging_and_throughput(key, record, time_ms)
        if isinstance(key, str) and key not in self.first:
            self.first[key] = record["value"]
        if key == "seed":
            self.seeds.append((json.dumps(record["value"], sort_keys=True), number))
        if key in EVAL_KEYS and self.stop is None and len(self.evals) < MAX_EVAL_POINTS:
            point = _eval_point(key, record)
            if point is not None:
                self.evals.append(point)

    def _staging_and_throughput(self, key: str, record: dict[str, Any], time_ms: float) -> None:
        begin, end = self.staging
        if key == "staging_start" and begin is None:
            self.staging = (time_ms, None)
        elif key == "staging_stop" and begin is not None and end is None:
            self.staging = (begin, time_ms)
        elif key == "tracked_stats" and self.stop is None and len(self.throughputs) < MAX_EVAL_POINTS:
            value = record["value"]
            rate = _number(value.get("throughput")) if isinstance(value, dict) else None
            if rate is not None and rate > 0:
                self.throughputs.append(rate)

    @property
    def staging_ms(self) -> float | None:
        begin, end = self.staging
        return None if begin is None or end is None or end < begin else end - begin


def _eval_point(key: str, record: dict[str, Any]) -> tuple[str, float, float] | None:
    metadata = record["metadata"]
    try:
        epoch = float(metadata["epoch_num"])
        value = float(record["value"])
    except (TypeError, ValueError, KeyError, OverflowError):
        return None
    return key, epoch, value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def parse_log(path: Path | str) -> RunLog:
    """Parse `path`; bad lines become `parse_errors`; an unreadable file, or one that is not a regular
    file, raises OSError (`safe_read.RefusedFile`)."""
    lines = _Lines()
    state = _Collector()
    rcp = RcpReader()
    with safe_read.open_text(path) as handle:
        for number, text in enumerate(handle, start=1):
            lines.binary = lines.binary or "\x00" in text
            if TOKEN not in text:
                continue
            lines.mllog.append(number)
            if lines.long_line is None and len(text) > MAX_MLLOG_LINE_CHARS:
                lines.long_line = (number, len(text))
            part = json_part(text)
            if part is None:
                lines.errors.append((number, "nothing after ':::MLLOG'"))
                continue
            raw: Any = None
            try:
                raw = _load(part)
                record = _validate(raw)
            except ValueError as e:
                lines.errors.append((number, str(e)))
                rcp.feed(part, number, raw)
                continue
            why = impossible_time(record["time_ms"])
            if why is not None:
                lines.impossible.append((number, why))
                continue  # neither the timing nor the RCP reading may take it
            state.add(record, number)
            rcp.feed(part, number, raw)
    return _run_log(path, lines, state, rcp.result())


@dataclass
class _Lines:
    """What one pass saw of the file's lines, beside their events."""

    mllog: list[int] = field(default_factory=list)
    """The numbers of the lines with ':::MLLOG'."""
    errors: list[tuple[int, str]] = field(default_factory=list)
    binary: bool = False
    long_line: tuple[int, int] | None = None
    impossible: list[tuple[int, str]] = field(default_factory=list)


def _run_log(path: Path | str, lines: _Lines, state: _Collector, rcp: RcpRead) -> RunLog:
    """The RunLog of one pass: its lines, the run's interval and the first value of each key."""
    start, stop, first = state.start, state.stop, state.first
    return RunLog(
        path=str(path),
        mllog_lines=tuple(lines.mllog),
        parse_errors=tuple(lines.errors),
        binary=lines.binary,
        run_start_ms=None if start is None else start[0],
        run_start_line=None if start is None else start[1],
        run_stop_ms=None if stop is None else stop[0],
        run_stop_line=None if stop is None else stop[1],
        run_stop_status=None if stop is None else stop[2],
        seeds=tuple(state.seeds),
        number_of_nodes=first.get("number_of_nodes"),
        accelerators_per_node=first.get("accelerators_per_node"),
        benchmark=_text(first.get("submission_benchmark")),
        division=_text(first.get("submission_division")),
        global_batch_size=first.get("global_batch_size"),
        staging_before_run_start=state.staging_first,
        backwards=None if not state.backwards else (state.backwards, state.backwards_line or 0),
        evals=tuple(state.evals),
        rcp=rcp,
        long_line=lines.long_line,
        achieved_flops_per_s=_number(first.get(ACHIEVED_FLOPS)),
        valid_flops=_number(first.get(VALID_FLOPS)),
        loop_mode=_text(first.get(LOOP_MODE)) or "target",
        flops_per_sample=_number(first.get(FLOPS_PER_SAMPLE)),
        vflops_exponent=_number(first.get(VFLOPS_EXPONENT)),
        train_samples=_number(first.get("train_samples")),
        submitter=first.get("submission_org"),
        system=first.get("submission_platform"),
        status=first.get("submission_status"),
        staging_ms=state.staging_ms,
        throughputs=tuple(state.throughputs),
        impossible=tuple(lines.impossible),
    )


def sniff_log(path: Path | str) -> LogSniff:
    """Benchmark, run_start time and staging order from the head of a file; never raises."""
    benchmark: str | None = None
    staging = False
    try:
        with safe_read.open_text(path) as handle:
            read = 0
            for text in handle:
                read += len(text)
                if read > SNIFF_BYTES:
                    break
                if TOKEN not in text:
                    continue
                try:
                    record = decode_mllog(text)
                except ValueError:
                    continue
                key = record["key"]
                if key == "submission_benchmark" and benchmark is None:
                    benchmark = _text(record["value"])
                elif key == "staging_start":
                    staging = True
                elif key == "run_start":
                    return LogSniff(benchmark, record["time_ms"], staging)
    except OSError:
        pass
    return LogSniff(benchmark, None, staging)


def find_line(path: Path | str, text: str) -> int | None:
    """1-based line of the first line in `path` whose `:::MLLOG` part equals `text`, or None."""
    text = text.strip()
    with safe_read.open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if TOKEN in line and line[line.rindex(TOKEN) :].strip() == text:
                return number
    return None
