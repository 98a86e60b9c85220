"""Two characterizations side by side (this CPU and a GPU, two node counts, two configs): each level's
headline figures for A and B and their ratio, and the plots that differ most, on one page."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlhpc.characterize.page import PHASE_COLOURS, page, seconds, section, si, table
from mlhpc.characterize.runner import FORMAT, JSON_NAME
from mlhpc.characterize.svg import figure, svg_text
from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.writable import page_kind, refuse_output_over_inputs

COMPARE_PAGE = "compare.html"
GENERATOR = "mlhpc characterize --compare"
"""The page's generator tag: an existing compare.html is replaced only when it carries it."""
OUT_FILES = {COMPARE_PAGE: page_kind(GENERATOR)}
Figure = tuple[str, Callable[[dict[str, Any]], float | None], Callable[[float | None], str]]


def _get(*path: str) -> Callable[[dict[str, Any]], float | None]:
    def read(report: dict[str, Any]) -> float | None:
        value: Any = report
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return read


def _memory_peak(report: dict[str, Any]) -> float | None:
    points = report.get("memory", {}).get("points") or []
    return max((p["measured_peak_bytes"] for p in points), default=None)


def _phase(name: str) -> Callable[[dict[str, Any]], float | None]:
    def read(report: dict[str, Any]) -> float | None:
        phases = report.get("operators", {}).get("phases") or []
        return next((p["range_seconds"] for p in phases if p["phase"] == name), None)

    return read


def _io(pass_name: str, key: str) -> Callable[[dict[str, Any]], float | None]:
    return _get("io", pass_name, key)


def _flop(v: float | None) -> str:
    return si(v, "FLOP")


def _bytes(v: float | None) -> str:
    return si(v, "B")


def _rate(v: float | None) -> str:
    return si(v, "FLOP/s")


def _bandwidth(v: float | None) -> str:
    return si(v, "B/s")


def _share(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _plain(v: float | None) -> str:
    return si(v)


LEVEL_FIGURES: tuple[tuple[str, tuple[Figure, ...]], ...] = (
    ("Analytic, per sample", (
        ("training FLOPs", _get("analytic", "training_flops_per_sample"), _flop),
        ("saved activations", _get("analytic", "activation_bytes_per_sample"), _bytes),
        ("parameters", _get("analytic", "parameter_bytes"), _bytes),
        ("sample bytes on disk", _get("analytic", "sample_bytes"), _bytes),
        ("FLOP per memory byte", _get("analytic", "flop_per_memory_byte"), _plain),
        ("all-reduce bytes per step", _get("analytic", "allreduce_bytes_per_step"), _bytes),
    )),
    ("Operators", (
        ("step", _get("operators", "step_seconds"), seconds),
        ("forward", _phase("forward"), seconds),
        ("backward", _phase("backward"), seconds),
        ("optimizer", _phase("optimizer"), seconds),
        ("FLOPs per step", _get("operators", "flops_per_step"), _flop),
    )),
    ("Roofline", (
        ("peak (GEMM)", _get("roofline", "flops_per_s"), _rate),
        ("bandwidth (streaming)", _get("roofline", "bandwidth_bytes_per_s"), _bandwidth),
        ("ridge (FLOP/byte)", _get("roofline", "ridge_intensity"), _plain),
        ("workload achieved", _get("roofline", "workload", "flops_per_s"), _rate),
        ("workload of attainable", _get("roofline", "workload", "efficiency"), _share),
    )),
    ("Memory", (
        ("largest measured peak", _memory_peak, _bytes),
        ("peak growth per sample", _get("memory", "measured_growth"), _bytes),
    )),
    ("I/O", (
        ("read latency p50", _io("first_touch", "latency_p50_s"), seconds),
        ("read latency p99", _io("first_touch", "latency_p99_s"), seconds),
        ("bytes read per sample", _io("first_touch", "read_bytes_per_sample"), _bytes),
        ("one reader's bandwidth", _io("first_touch", "bandwidth_bytes_per_s"), _bandwidth),
    )),
    ("Distributed", (
        ("all-reduced bytes per step", _get("communication", "allreduce_bytes_per_step"), _bytes),
        ("time in collectives", _get("communication", "comm_s"), seconds),
        ("share of the step", _get("communication", "comm_share"), _share),
        ("bus bandwidth", _get("communication", "bus_bandwidth_bytes_per_s"), _bandwidth),
    )),
)


def load(path: Path) -> dict[str, Any]:
    """A characterize.json (or the folder holding one), refused in one line if it is not one."""
    file = path / JSON_NAME if path.is_dir() else path
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{file}: not a readable characterize.json ({error}); pass the --out of mlhpc characterize") from None
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise ConfigError(f"{file}: not written by mlhpc characterize (format {FORMAT}); pass a characterize --out")
    for key in ("benchmark", "config", "system", "analytic"):
        if key not in report:
            raise ConfigError(f"{file}: no {key!r}; rerun mlhpc characterize to write it whole")
    return report


def label(report: dict[str, Any]) -> str:
    s = report["system"]
    threads = (s.get("threads") or {}).get("intra_op", s.get("torch_threads"))
    return f"{report['benchmark']} {report['config']} on {s['device_name']} ({s['device']}, {threads} threads)"


def _system_row(name: str, report: dict[str, Any]) -> tuple[str, ...]:
    s = report["system"]
    threads = s.get("threads") or {}
    return (
        name,
        f"{report['benchmark']} --config {report['config']}",
        f"{s['device_name']} ({s['device']})",
        str(threads.get("intra_op", s.get("torch_threads"))),
        str(threads.get("source", "")),
        str(s["host"]),
        str(s["torch"]),
        str(s["date"]),
    )


def compare_page(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The comparison of two characterize reports, A against B, level by level."""
    header = ("", "workload", "device", "threads", "threads chosen by", "host", "torch", "date")
    intro = table(header, [_system_row("A", a), _system_row("B", b)], len(header))
    parts = ["<h1>Characterization: A against B</h1>", intro]
    for title, figures in LEVEL_FIGURES:
        rows = []
        for name, read, shown in figures:
            va, vb = read(a), read(b)
            if va is None and vb is None:
                continue
            ratio = f"{vb / va:.3g}" if va and vb is not None else "–"
            rows.append((name, shown(va), shown(vb), ratio))
        if rows:
            parts.append(section(title, table(("figure", "A", "B", "B / A"), rows), _anchor(title)))
    if "operators" in a and "operators" in b:
        parts.append(section("Where the step goes", _phases_svg(a, b), "phases"))
    return page(f"{label(a)} against {label(b)}", "".join(parts), GENERATOR)


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _phases_svg(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Each system's step as stacked phase seconds, side by side."""
    fig, ax = figure(7.0, 2.6)
    names = ["A", "B"]
    left = [0.0, 0.0]
    for phase in ("forward", "backward", "optimizer"):
        values = [_phase(phase)(r) or 0.0 for r in (a, b)]
        ax.barh(names, values, left=left, color=PHASE_COLOURS[phase], label=phase)
        left = [x + v for x, v in zip(left, values, strict=True)]
    ax.set_xlabel("seconds per step")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="lower right")
    return svg_text(fig)


def compare_command(first: Path, second: Path, *, out: Path) -> Path:
    """Write out/compare.html for two characterize outputs; returns the page."""
    out = refuse_output_over_inputs(out, [first, second], "--out", folder=True, writes=OUT_FILES)
    a, b = load(first), load(second)
    try:
        text = compare_page(a, b)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        # Both files passed load(); a figure of the wrong kind deeper in is still outside input.
        raise ConfigError(
            f"{first} or {second}: not laid out as mlhpc characterize writes it ({type(error).__name__}: "
            f"{error}); rerun mlhpc characterize for both"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out / COMPARE_PAGE, text)
