"""The characterize page: one self-contained HTML file (inline SVG plots, no scripts) that reads a
characterize.json level by level. Pure: a JSON dict in, the page's text out."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from mlhpc.characterize.svg import figure, svg_text
from mlhpc.common.display.html_words import STYLE as WORDS_STYLE
from mlhpc.common.display.html_words import keep_words
from mlhpc.common.safeio.writable import generator_meta
from mlhpc.submission_checker.html_report import STYLE

PHASE_COLOURS = {"forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c", "other": "#7f7f7f"}
MEMORY_ORDER = (
    ("parameters", "weights"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state"),
    ("activations", "saved activations"),
    ("temporaries", "temporaries"),
    ("inputs", "input batch"),
    ("autograd_detail", "autograd detail"),
    ("uncategorized", "uncategorized"),
)
TOP_OPERATORS = 15
GENERATOR = "mlhpc characterize"
"""The page's generator tag: an existing characterize.html is replaced only when it carries it."""


def e(value: object) -> str:
    return html.escape(str(value))


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """1.23 G{unit}: decimal prefixes, as FLOP/s and bandwidths are quoted."""
    if value is None:
        return "–"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], numeric_from: int = 1) -> str:
    """A table whose cells are already text (escaped here); columns from `numeric_from` right-aligned."""
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{e(c)}</td>' if i >= numeric_from else f"<td>{e(c)}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'


def section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{e(title)}</h2>{body}</section>'


def characterize_page(report: dict[str, Any]) -> str:
    """The whole page for one characterize.json."""
    title = f"{report['benchmark']} --config {report['config']} on {report['system']['device_name']}"
    parts = [
        f"<h1>Characterization of {e(title)}</h1>",
        system_html(report),
        skipped_html(report["skipped"]),
    ]
    if report["analytic"]:
        parts.append(analytic_html(report["analytic"]))
    if report.get("published"):
        parts.append(published_html(report["published"]))
    for level, render in LEVELS:
        if level in report:
            parts.append(render(report[level]))
    return page(title, "".join(parts), GENERATOR)


def page(title: str, body: str, generator: str) -> str:
    return keep_words(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{generator_meta(generator)}'
        f"<title>{e(title)}</title>"
        f"<style>{STYLE}{WORDS_STYLE}</style></head><body>{body}</body></html>\n"
    )


def system_html(report: dict[str, Any]) -> str:
    s = report["system"]
    overrides = " ".join(report["overrides"]) or "none"
    return (
        f"<p>{e(s['device'])}: {e(s['device_name'])}, {s['cpus']} CPUs, {s['torch_threads']} torch threads; "
        f"torch {e(s['torch'])}, mlhpc {e(s['mlhpc'])}; host {e(s['host'])}, {e(s['date'])}. "
        f"Overrides: <code>{e(overrides)}</code>.</p>"
    )


def skipped_html(skipped: dict[str, str]) -> str:
    if not skipped:
        return ""
    items = "".join(f"<li><b>{e(level)}</b>: {e(reason)}</li>" for level, reason in skipped.items())
    return f'<p class="warning">Levels not measured:</p><ul>{items}</ul>'


def analytic_html(a: dict[str, Any]) -> str:
    rows = [
        ("forward FLOPs", si(a["forward_flops_per_sample"], "FLOP")),
        ("backward FLOPs (weight + input gradients)", si(a["backward_flops_per_sample"], "FLOP")),
        ("training FLOPs", si(a["training_flops_per_sample"], "FLOP")),
        ("torch's FLOP counter, forward / backward",
         f"{si(a['counter_forward_flops_per_sample'], 'FLOP')} / {si(a['counter_backward_flops_per_sample'], 'FLOP')}"),
        ("parameters", f"{a['parameter_count']:,} ({si(a['parameter_bytes'], 'B')})"),
        ("optimizer state", si(a["optimizer_state_bytes"], "B")),
        ("saved activations", si(a["activation_bytes_per_sample"], "B")),
        ("input batch (fields and labels)", si(a["input_bytes_per_sample"], "B")),
        ("sample bytes on disk", si(a["sample_bytes"], "B")),
        ("compulsory memory traffic", si(a["compulsory_traffic_bytes_per_sample"], "B")),
        ("FLOP per sample byte", si(a["flop_per_sample_byte"])),
        ("FLOP per memory byte (compulsory)", si(a["flop_per_memory_byte"])),
        ("all-reduce bytes per step", si(a["allreduce_bytes_per_step"], "B")),
        ("input bandwidth per PFLOP/s", si(a["input_bandwidth_per_pflops"], "B/s")),
    ]
    excess = a["counter_grouped_weight_grad_excess_flops_per_sample"]
    note = (
        f"<p>torch's FLOP counter counts a grouped convolution's weight gradient once per group: "
        f"{si(excess, 'FLOP')} more backward FLOPs than the layers do.</p>" if excess else ""
    )
    traffic = a["traffic"]
    terms = [(k.replace("_", " "), si(v, "B")) for k, v in traffic.items()
             if k not in ("formula", "total", "micro_batch_size", "optimizer_batch_size")]
    layers = sorted(a["layers"], key=lambda r: -(r["forward_flops"] + r["backward_weight_flops"] + r["backward_input_flops"]))
    top = [
        (r["name"], r["kind"], "×".join(map(str, r["output_shape"][1:])), si(r["forward_flops"], "FLOP"),
         si(r["backward_weight_flops"] + r["backward_input_flops"], "FLOP"))
        for r in layers[:10]
    ]
    body = (
        f"<p>Per training sample, counted from the model's layers at the config's input size on the "
        f"{e(a['device'])} device (no data, no timing).</p>"
        + table(("quantity", "per sample"), rows)
        + note
        + f"<h3>Compulsory memory traffic</h3><p>{e(traffic['formula'])} (batch {traffic['micro_batch_size']}).</p>"
        + table(("term", "bytes per sample"), terms)
        + "<h3>Layers with the most FLOPs</h3>"
        + table(("layer", "kind", "output of a sample", "forward", "backward"), top, numeric_from=3)
    )
    return section("Analytic, per sample", body, "analytic")


def published_html(published: dict[str, Any]) -> str:
    rows = [
        (r["quantity"], "–" if r["mlhpc"] is None else f"{r['mlhpc']:.4g}", f"{r['published']:,}", r["unit"],
         "–" if r["ratio"] is None else f"{r['ratio']:.2f}", r["why"])
        for r in published["rows"]
    ]
    body = f"<p>{e(published['source'])}.</p>" + table(
        ("quantity", "mlhpc", "published", "unit", "mlhpc / published", "why they differ"), rows
    )
    return section("Against the published characterization", body, "published")


def operators_html(ops: dict[str, Any]) -> str:
    top = sorted(ops["operators"], key=lambda o: -o["step_share"])[:TOP_OPERATORS]
    fig, ax = figure(7.0, 0.28 * len(top) + 1.0)
    labels = [f"{o['op']} ({o['phase']})" for o in reversed(top)]
    shares = [100 * o["step_share"] for o in reversed(top)]
    colours = [PHASE_COLOURS.get(o["phase"], PHASE_COLOURS["other"]) for o in reversed(top)]
    ax.barh(labels, shares, color=colours)
    ax.set_xlabel("share of the step (%)")
    ax.tick_params(axis="y", labelsize=7)
    phases = table(
        ("phase", "seconds per step", "share", "FLOPs per step"),
        [(p["phase"], seconds(p["range_seconds"]), f"{100 * p['step_share']:.1f} %", si(p["flops"], "FLOP"))
         for p in ops["phases"]],
    )
    rows = [
        (o["op"], o["phase"], f"{o['calls_per_step']:g}", seconds(o["seconds_per_step"]),
         f"{100 * o['step_share']:.1f} %", si(o["flops_per_step"], "FLOP"), si(o["flops_per_s"], "FLOP/s"),
         si(o["bytes_per_step"], "B"), "–" if o["intensity"] is None else f"{o['intensity']:.3g}")
        for o in top
    ]
    body = (
        f"<p>{ops['steps']} timed steps of {seconds(ops['step_seconds'])} on {e(ops['device'])} "
        f"({e(ops['time_basis'])}); {si(ops['flops_per_step'], 'FLOP')} a step.</p>"
        + phases + svg_text(fig)
        + table(("operator", "phase", "calls", "time", "share", "FLOPs", "FLOP/s", "bytes", "FLOP/byte"), rows, 2)
    )
    return section("Operators", body, "operators")


def roofline_html(roof: dict[str, Any]) -> str:
    fig, ax = figure(7.0, 4.2)
    peak, bandwidth, ridge = roof["flops_per_s"], roof["bandwidth_bytes_per_s"], roof["ridge_intensity"]
    points = list(roof["points"]) + ([roof["workload"]] if roof["workload"] else [])
    xs = [p["intensity"] for p in points if p["intensity"] > 0] or [ridge]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    ax.loglog([lo, ridge, hi], [bandwidth * lo, peak, peak], color="black", linewidth=1.5)
    for p in roof["points"][:TOP_OPERATORS]:
        colour = PHASE_COLOURS.get(p["label"].split("/", 1)[0], PHASE_COLOURS["other"])
        ax.scatter(p["intensity"], p["flops_per_s"], color=colour, s=24)
        ax.annotate(p["label"].split("/", 1)[-1].replace("aten::", ""), (p["intensity"], p["flops_per_s"]),
                    fontsize=6, xytext=(3, 2), textcoords="offset points")
    if roof["workload"]:
        w = roof["workload"]
        ax.scatter(w["intensity"], w["flops_per_s"], marker="*", s=140, color="#d62728", label="workload (analytic)")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    rows = [(p["label"], f"{p['intensity']:.3g}", si(p["flops_per_s"], "FLOP/s"),
             si(p["attainable_flops_per_s"], "FLOP/s"), f"{100 * p['efficiency']:.0f} %", p["bound"])
            for p in points[: TOP_OPERATORS + 1]]
    body = (
        f"<p>Measured peaks: {si(peak, 'FLOP/s')} (GEMM), {si(bandwidth, 'B/s')} (streaming); ridge at "
        f"{ridge:.3g} FLOP/byte. Operators by phase colour; the star is the workload's analytic "
        f"intensity at its achieved training rate. FLOPs are counted as a direct convolution does "
        f"them: a point above the roof ran a cheaper algorithm (oneDNN and cuDNN may pick Winograd or "
        f"FFT convolutions), or from cache.</p>"
        + svg_text(fig)
        + table(("point", "FLOP/byte", "achieved", "attainable", "of attainable", "bound"), rows)
    )
    return section("Roofline", body, "roofline")


def memory_html(mem: dict[str, Any]) -> str:
    points = mem["points"]
    fig, ax = figure(7.0, 3.4)
    labels = [str(p["batch_size"]) for p in points]
    bottom = [0.0] * len(points)
    for key, name in MEMORY_ORDER:
        values = [p["categories"][key] / 2**20 for p in points]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(labels, [p["measured_peak_bytes"] / 2**20 for p in points], marker="_", s=600, color="black",
               label="measured peak", zorder=3)
    ax.set_xlabel("batch size")
    ax.set_ylabel("MiB at the step's peak")
    ax.legend(fontsize=7, loc="upper left")
    rows = [
        (str(p["batch_size"]), *(si(p["categories"][k], "B") for k, _ in MEMORY_ORDER),
         si(p["measured_peak_bytes"], "B"), p["peak_phase"])
        for p in points
    ]
    growth = mem.get("measured_growth")
    body = (
        f"<p>On {e(mem['device'])}: the step's memory at its peak, by what holds it (torch's memory "
        f"profiler's categories), against the measured peak. The peak grows by {si(growth, 'B')} a sample.</p>"
        + svg_text(fig)
        + table(("batch", *(name for _, name in MEMORY_ORDER), "measured peak", "peak in"), rows)
    )
    return section("Memory", body, "memory")


def io_html(io: dict[str, Any]) -> str:
    rows = []
    for name in ("first_touch", "second_touch"):
        p = io[name]
        rows.append((name.replace("_", " "), seconds(p["latency_p50_s"]), seconds(p["latency_p99_s"]),
                     si(p["read_bytes_per_sample"], "B"), si(p["storage_bytes_per_sample"], "B"),
                     si(p["bandwidth_bytes_per_s"], "B/s"), f"{p['samples_per_s'] or 0:.3g}"))
    body = (
        f"<p>{io['samples']} of {io['dataset_samples']} samples read one by one through the benchmark's own "
        f"dataset; {si(io['file_bytes_per_sample'], 'B')} of files a sample. Byte counts from "
        f"{e(io['counter'] or 'nowhere (no /proc)')}; cached pages {'dropped' if io['evicted'] else 'not dropped'} first.</p>"
        + table(("pass", "latency p50", "latency p99", "read a sample", "from storage", "bandwidth", "samples/s"), rows)
    )
    return section("I/O", body, "io")


def communication_html(c: dict[str, Any]) -> str:
    match = "equal" if c["allreduce_bytes_per_step"] == c["analytic_allreduce_bytes"] else "different"
    rows = [
        ("all-reduced bytes per step (measured)", si(c["allreduce_bytes_per_step"], "B")),
        ("analytic all-reduce bytes", si(c["analytic_allreduce_bytes"], "B")),
        ("bytes each rank sends (ring)", si(c["ring_bytes_sent_per_rank"], "B")),
        ("collectives per step", str(c["collectives_per_step"])),
        ("step, with communication", seconds(c["step_s"])),
        ("step, without", seconds(c["step_no_comm_s"])),
        ("time in collectives", seconds(c["comm_s"])),
        ("share of the step", f"{100 * c['comm_share']:.1f} %"),
        ("exposed (not hidden by the backward)", seconds(c["exposed_comm_s"])),
        ("algorithm bandwidth", si(c["algorithm_bandwidth_bytes_per_s"], "B/s")),
        ("bus bandwidth", si(c["bus_bandwidth_bytes_per_s"], "B/s")),
    ]
    body = (
        f"<p>{c['world_size']} ranks ({e(c['backend'])}), {c['steps']} steps of data-parallel training; "
        f"the measured volume and the analytic one are {match}.</p>" + table(("quantity", "value"), rows)
    )
    return section("Distributed: communication", body, "communication")


LEVELS = (
    ("operators", operators_html),
    ("roofline", roofline_html),
    ("memory", memory_html),
    ("io", io_html),
    ("communication", communication_html),
)
