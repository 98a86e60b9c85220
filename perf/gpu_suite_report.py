"""Assemble `perf/gpu_suite.sh`'s outputs into one dated markdown record, newest first in
perf/RESULTS.md (and a copy in the suite's output folder).

    python perf/gpu_suite_report.py OUTDIR [--results perf/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path


def read(path: Path, default: str = "(missing: the step did not run or failed; see its log)") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def last_line_with(path: Path, prefix: str) -> str:
    lines = [line for line in read(path, "").splitlines() if line.startswith(prefix)]
    return lines[-1] if lines else f"(no '{prefix}' line in {path.name})"


def mini_run(folder: Path) -> str:
    """One line on the mini run to target: status, epochs, time-to-train, last epoch's samples/s."""
    logs = sorted(folder.glob("*/results/*/strong/*/result_*.txt"))
    if not logs:
        return f"(no result log under {folder}; see mini.log)"
    events = [
        json.loads(line.split(":::MLLOG", 1)[1]) for line in logs[0].read_text().splitlines() if ":::MLLOG" in line
    ]
    by_key: dict[str, list[dict]] = {}
    for event in events:
        by_key.setdefault(event["key"], []).append(event)
    stop = by_key.get("run_stop", [{}])[-1]
    start_ms = by_key.get("run_start", [{"time_ms": 0}])[0]["time_ms"]
    throughput = [e["value"]["throughput"] for e in by_key.get("tracked_stats", [])]
    metric = next((k for k in ("eval_error", "eval_accuracy") if k in by_key), None)
    final = by_key[metric][-1]["value"] if metric else float("nan")
    return (
        f"{logs[0].parts[-2]} mini: {stop.get('metadata', {}).get('status', '?')} in "
        f"{stop.get('metadata', {}).get('epoch_num', '?')} epochs, time to train "
        f"{(stop.get('time_ms', start_ms) - start_ms) / 1000:.1f} s, final {metric} {final:.4f}, "
        f"last epoch {throughput[-1] if throughput else 0:.0f} samples/s"
    )


def report(outdir: Path) -> str:
    env = read(outdir / "env.txt")
    today = datetime.date.today().isoformat()
    device = next((line for line in env.splitlines() if line.startswith("GPU")), "GPU: unknown")
    return "\n".join(
        [
            f"## {today}: GPU suite, {device.split('(')[0].strip()}",
            "",
            "Command: `bash perf/gpu_suite.sh` on the lent GPU machine (its stock PyTorch image; the",
            "project installed with `pip install --no-deps`, missing wheels carried in `.whl/`).",
            "",
            "```",
            env,
            "```",
            "",
            "### Training-step throughput, full-size models, synthetic batches on the device",
            "",
            read(outdir / "throughput.md"),
            "",
            "### Through `mlhpc run`",
            "",
            f"- {mini_run(outdir / 'mini')}",
            f"- {last_line_with(outdir / 'overhead.log', 'loop overhead:')} "
            f"(`perf/loop_overhead.py` on the GPU; {last_line_with(outdir / 'overhead.log', 'wall ratio:')})",
            f"- {last_line_with(outdir / 'nccl.log', 'nccl:')}",
            "",
        ]
    )


def insert_newest_first(results: Path, section: str) -> None:
    text = results.read_text() if results.exists() else "# Measured results\n\n"
    at = text.find("\n## ")
    text = f"{text.rstrip()}\n\n{section}\n" if at < 0 else f"{text[: at + 1]}{section}\n{text[at + 1 :]}"
    tmp = results.with_name(results.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "RESULTS.md")
    args = parser.parse_args()
    section = report(args.outdir)
    (args.outdir / "gpu_suite.md").write_text(section)
    insert_newest_first(args.results, section)
    print(section)


if __name__ == "__main__":
    main()
