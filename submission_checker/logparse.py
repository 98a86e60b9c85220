"""Read the few facts the checker needs from one `:::MLLOG` result file, with real line numbers.

Lines are picked and decoded the way `mlperf_logging`'s parser does it (latin-1, any line holding
`:::MLLOG `, text from its last occurrence), so times match the official result summarizer's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN = ":::MLLOG "


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

    @property
    def has_start_stop(self) -> bool:
        return self.run_start_ms is not None and self.run_stop_ms is not None

    @property
    def instance_scale(self) -> int | None:
        """Accelerators one model uses: number_of_nodes × max(accelerators_per_node, 1)."""
        try:
            return int(self.number_of_nodes) * max(int(self.accelerators_per_node), 1)
        except (TypeError, ValueError):
            return None


def decode_mllog(text: str) -> dict[str, Any]:
    """Decode one line that holds `:::MLLOG `; raise ValueError saying what is wrong."""
    line = text[text.rindex(TOKEN) :].strip()
    if not line.startswith(TOKEN):
        raise ValueError("nothing after ':::MLLOG'")
    try:
        record = json.loads(line[len(TOKEN) :])
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON after ':::MLLOG': {e}") from e
    except RecursionError as e:
        raise ValueError("the JSON after ':::MLLOG' is nested too deeply") from e
    if not isinstance(record, dict):
        raise ValueError("the JSON after ':::MLLOG' is not an object")
    missing = [k for k in ("time_ms", "key", "value", "metadata") if k not in record]
    if missing:
        raise ValueError(f"the record lacks {', '.join(missing)}")
    try:
        record["time_ms"] = float(record["time_ms"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"time_ms={record['time_ms']!r} is not a number") from e
    return record


def parse_log(path: Path | str) -> RunLog:
    """Parse `path`; bad lines become `parse_errors`, an unreadable file raises OSError."""
    mllog_lines: list[int] = []
    errors: list[tuple[int, str]] = []
    binary = False
    start: tuple[float, int] | None = None
    stop: tuple[float, int, str | None] | None = None
    nodes: Any = None
    accels: Any = None
    seeds: list[tuple[str, int]] = []
    with open(path, encoding="latin-1") as handle:
        for number, text in enumerate(handle, start=1):
            binary = binary or "\x00" in text
            if TOKEN not in text:
                continue
            mllog_lines.append(number)
            try:
                record = decode_mllog(text)
            except ValueError as e:
                errors.append((number, str(e)))
                continue
            key, metadata = record["key"], record["metadata"]
            # As mlperf_logging's result summarizer: take run_start/run_stop until both are seen.
            if start is None or stop is None:
                if key == "run_start":
                    start = (record["time_ms"], number)
                elif key == "run_stop":
                    status = metadata.get("status") if isinstance(metadata, dict) else None
                    stop = (record["time_ms"], number, None if status is None else str(status))
            if nodes is None or accels is None:
                if key == "number_of_nodes":
                    nodes = record["value"]
                elif key == "accelerators_per_node":
                    accels = record["value"]
            if key == "seed":
                seeds.append((json.dumps(record["value"], sort_keys=True), number))
    return RunLog(
        path=str(path),
        mllog_lines=tuple(mllog_lines),
        parse_errors=tuple(errors),
        binary=binary,
        run_start_ms=None if start is None else start[0],
        run_start_line=None if start is None else start[1],
        run_stop_ms=None if stop is None else stop[0],
        run_stop_line=None if stop is None else stop[1],
        run_stop_status=None if stop is None else stop[2],
        seeds=tuple(seeds),
        number_of_nodes=nodes,
        accelerators_per_node=accels,
    )


def find_line(path: Path | str, text: str) -> int | None:
    """1-based line of the first line in `path` whose `:::MLLOG` part equals `text`, or None."""
    text = text.strip()
    with open(path, encoding="latin-1") as handle:
        for number, line in enumerate(handle, start=1):
            if TOKEN in line and line[line.rindex(TOKEN) :].strip() == text:
                return number
    return None
