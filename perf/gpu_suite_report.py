"""The GPU suite's record: `perf/gpu_suite.sh` assembles it on the GPU machine, and it is merged
into perf/RESULTS.md here, dated, newest first.

    python perf/gpu_suite_report.py --work WORK --out OUT    # the suite's trap: OUT/gpu_suite.md
    python perf/gpu_suite_report.py --merge FILE [--results perf/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import stat
import sys
from pathlib import Path

MISSING = "(missing: the step did not run or failed; see gpu_suite.log)"
MAX_RECORD_BYTES = 256 * 1024
"""A returned record is a page of text; anything larger is not one."""
HEADING = "## "
TITLE = ": GPU suite"


def read(path: Path, default: str = MISSING) -> str:
    try:
        return path.read_text(errors="replace").strip() or default
    except OSError:
        return default


def last_line_with(path: Path, prefix: str) -> str:
    lines = [line for line in read(path, "").splitlines() if line.startswith(prefix)]
    return lines[-1] if lines else f"(no '{prefix}' line: the step did not finish)"


def mini_run(log: Path) -> str:
    """One line on the mini run to target: status, epochs, time-to-train, last epoch's samples/s."""
    events = []
    for line in read(log, "").splitlines():
        if ":::MLLOG" in line:
            try:
                events.append(json.loads(line.split(":::MLLOG", 1)[1]))
            except ValueError:
                continue
    if not events:
        return "cosmoflow mini: no result log (see gpu_suite.log)"
    by_key: dict[str, list[dict]] = {}
    for event in events:
        by_key.setdefault(event.get("key", ""), []).append(event)
    stop = by_key.get("run_stop", [{}])[-1]
    start_ms = by_key.get("run_start", [{"time_ms": 0}])[0].get("time_ms", 0)
    throughput = [e["value"]["throughput"] for e in by_key.get("tracked_stats", [])]
    metric = next((k for k in ("eval_error", "eval_accuracy") if k in by_key), None)
    final = by_key[metric][-1]["value"] if metric else float("nan")
    return (
        f"cosmoflow mini: {stop.get('metadata', {}).get('status', '?')} in "
        f"{stop.get('metadata', {}).get('epoch_num', '?')} epochs, time to train "
        f"{(stop.get('time_ms', start_ms) - start_ms) / 1000:.1f} s, final {metric} {final:.4f}, "
        f"last epoch {throughput[-1] if throughput else 0:.0f} samples/s"
    )


def mini_settings(breakdown: Path) -> str:
    """How the mini run trained (its breakdown's settings): which loader ran, the precision, ..."""
    try:
        settings = json.loads(breakdown.read_text()).get("settings", {})
    except (OSError, ValueError, AttributeError):
        return "mini run settings: no breakdown file"
    return "mini run settings: " + ", ".join(f"{key} {value}" for key, value in sorted(settings.items()))


def characterized(path: Path) -> str:
    """One line from `mlhpc characterize`'s JSON: the step, where it went, the machine's peaks, the
    workload's place under them and the memory peak (the whole JSON comes back beside it)."""
    try:
        found = json.loads(path.read_text())
        ops, roof, memory = found["operators"], found["roofline"], found["memory"]
        phases = ", ".join(f"{p['phase']} {p['range_seconds'] * 1e3:.1f} ms" for p in ops["phases"])
        peak = max(p["measured_peak_bytes"] for p in memory["points"])
        workload = roof["workload"] or {}
        return (
            f"characterize cosmoflow mini: step {ops['step_seconds'] * 1e3:.1f} ms ({phases}); "
            f"peaks {roof['flops_per_s'] / 1e12:.3g} TFLOP/s GEMM, {roof['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s "
            f"streaming; workload {workload.get('flops_per_s', 0) / 1e12:.3g} TFLOP/s, "
            f"{100 * workload.get('efficiency', 0):.0f} % of its roof; memory peak {peak / 2**20:.0f} MiB; "
            f"skipped: {', '.join(found['skipped']) or 'none'} (characterize.json)"
        )
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return f"characterize: {MISSING}"


def steps_table(steps: Path) -> list[str]:
    lines = ["| step | limit (s) | took (s) | outcome |", "|---|---|---|---|"]
    for row in read(steps, "").splitlines():
        parts = row.split("|")
        if len(parts) == 5:
            lines.append(f"| {parts[0]}. {parts[1]} | {parts[2]} | {parts[3]} | {parts[4]} |")
    return lines


def report(work: Path, out: Path) -> str:
    env = read(work / "env.txt")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    device = next(
        (line.split(":", 1)[1].strip() for line in env.splitlines() if line.startswith("GPU:")), "CPU"
    )
    return "\n".join(
        [
            f"{HEADING}{today}{TITLE}, {device}",
            "",
            "Command: `bash perf/gpu_suite.sh` on the lent GPU machine (its stock PyTorch image; the",
            "project installed with `pip install --no-deps --target`, missing wheels carried in `.whl/`).",
            "",
            "```",
            env,
            "```",
            "",
            *steps_table(work / "steps.txt"),
            "",
            "### Training-step throughput, full-size models, synthetic batches made on the device",
            "",
            read(work / "throughput.md"),
            "",
            "### Through `mlhpc run`",
            "",
            f"- {mini_run(out / 'mini_result.txt')}",
            f"- {mini_settings(out / 'mini_breakdown.json')}",
            f"- {last_line_with(work / 'overhead.log', 'loop overhead:')} "
            f"(`perf/loop_overhead.py`; {last_line_with(work / 'overhead.log', 'wall ratio:')}; "
            f"{last_line_with(work / 'overhead.log', 'loop_overhead:')})",
            f"- {last_line_with(work / 'nccl.log', 'nccl:')}",
            f"- {characterized(out / 'characterize.json')}",
            "",
        ]
    )


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def insert_newest_first(results: Path, section: str) -> None:
    text = results.read_text() if results.exists() else "# Measured results\n\n"
    at = text.find("\n## ")
    text = f"{text.rstrip()}\n\n{section}\n" if at < 0 else f"{text[: at + 1]}{section}\n{text[at + 1 :]}"
    write_atomically(results, text)


def returned_record(path: Path) -> str:
    """A `gpu_suite.md` that came back from the GPU machine, checked before it goes into RESULTS.md:
    a regular file of at most 256 KiB, UTF-8 text without NUL, opening with the suite's heading."""
    try:
        info = path.lstat()
    except OSError as e:
        raise SystemExit(
            f"gpu_suite_report: cannot read {path}: {e.strerror}; give the returned gpu_suite.md"
        ) from e
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RECORD_BYTES:
        raise SystemExit(
            f"gpu_suite_report: {path} is not a regular file of at most {MAX_RECORD_BYTES} bytes; "
            "give the returned gpu_suite.md"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise SystemExit(
            f"gpu_suite_report: {path} is not UTF-8 text; give the returned gpu_suite.md"
        ) from None
    first = text.split("\n", 1)[0]
    if "\0" in text or not (first.startswith(HEADING) and TITLE in first):
        raise SystemExit(
            f"gpu_suite_report: {path} does not open with a '## <date>: GPU suite' heading; "
            "give the gpu_suite.md that perf/gpu_suite.sh wrote"
        )
    return text.strip() + "\n"


def merge(record: Path, results: Path) -> None:
    section = returned_record(record)
    first = section.split("\n", 1)[0]
    if results.exists() and section.strip() in results.read_text():
        raise SystemExit(f"gpu_suite_report: {results} already holds '{first}'; nothing merged")
    insert_newest_first(results, section)
    print(f"gpu_suite_report: '{first}' merged into {results}, newest first")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, help="the suite's temporary folder (its steps' pieces)")
    parser.add_argument("--out", type=Path, help="the suite's $OUT: gpu_suite.md goes there")
    parser.add_argument("--merge", type=Path, help="a returned gpu_suite.md to put into --results")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "RESULTS.md")
    args = parser.parse_args()
    if args.merge is not None:
        merge(args.merge, args.results)
    elif args.work is not None and args.out is not None:
        write_atomically(args.out / "gpu_suite.md", report(args.work, args.out))
    else:
        parser.error("give --work and --out (the suite), or --merge FILE")
        sys.exit(2)


if __name__ == "__main__":
    main()
