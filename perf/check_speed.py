"""How much faster `mlhpc check` is than the official tools on one submission folder, same scores.

One run each, on the same machine: the official package checker (once per organisation) plus
the official result summarizer (once for the folder), as a reviewer runs them, against one
`mlhpc check`. The official tools write scaling.json and logs, so they run on a scratch copy;
`mlhpc check` runs on the folder itself. Prints both times (wall clock, and CPU time, which
another job on the machine disturbs less; `mlhpc check` spends its CPU time on all cores), the
ratios, and whether the scores agree (the summarizer's, after the package checker has set the RCP
scaling).

    python perf/check_speed.py /tmp/hpc_results_v3.0 --ruleset 3.0.0
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOLERANCE_MIN = 1e-6


class Clock:
    """Wall time and CPU time (user + system, of child processes and theirs) spent inside."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), _children_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, _children_cpu() - self.cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], cwd: Path) -> tuple[float, float]:
    with Clock() as clock:
        subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return clock.wall, clock.cpu


def _orgs(folder: Path) -> list[Path]:
    if (folder / "results").is_dir():
        return [folder]
    return sorted(d for d in folder.iterdir() if (d / "results").is_dir() and (d / "systems").is_dir())


def run_official(folder: Path, ruleset: str, scratch: Path) -> tuple[tuple[float, float], Path]:
    """Package checker per organisation, then the result summarizer: ((wall, cpu) s, its CSV)."""
    copy = scratch / "submission"
    shutil.copytree(folder, copy, symlinks=True)
    wall = cpu = 0.0
    for org in _orgs(copy):
        command = [sys.executable, "-m", "mlperf_logging.package_checker", str(org), "hpc", ruleset]
        w, c = _timed([*command, "--log_output", str(scratch / f"{org.name}.log")], scratch)
        wall, cpu = wall + w, cpu + c
    pattern = f"{copy}/{{*}}" if copy not in _orgs(copy) else str(copy)
    out = scratch / "summary.csv"
    command = [sys.executable, "-m", "mlperf_logging.result_summarizer", pattern, "hpc", ruleset]
    w, c = _timed([*command, "--csv", str(out)], scratch)
    return (wall + w, cpu + c), out


def official_scores(csv_path: Path, ruleset: str) -> dict[tuple[str, str, str, str], float]:
    """(submitter, system folder, scaling, benchmark) -> score, from the summarizer's CSV.

    The CSV holds the strong table, then the weak table with its own header; the system folder
    is the last part of each row's details_url.
    """
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    benchmarks = set(get_allowed_benchmarks("hpc", ruleset))
    scores: dict[tuple[str, str, str, str], float] = {}
    blocks = csv_path.read_text().split("\ndivision,")
    for number, block in enumerate(blocks):
        text = block if number == 0 else "division," + block
        for row in csv.DictReader(io.StringIO(text)):
            system = row["details_url"].rsplit("/", 1)[-1].removesuffix(".json")
            for column, value in row.items():
                if not _is_number(value):
                    continue
                if column.endswith(":time_to_train_all"):
                    scores[(row["submitter"], system, "weak", column.split(":")[0])] = float(value)
                elif column in benchmarks:
                    scores[(row["submitter"], system, "strong", column)] = float(value)
    return scores


def _is_number(value: str | None) -> bool:
    try:
        return value is not None and float(value) == float(value)  # NaN is no score
    except ValueError:
        return False


def run_ours(
    folder: Path, ruleset: str, scratch: Path
) -> tuple[tuple[float, float], dict[tuple[str, str, str, str], float]]:
    out = scratch / "mlhpc.json"
    command = [sys.executable, "-m", "mlhpc", "check", str(folder), "--ruleset", ruleset, "--json", str(out)]
    with Clock() as clock:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"mlhpc check failed ({done.returncode}): {done.stderr.strip()}")
    scores = {}
    for e in json.loads(out.read_text())["entries"]:
        if e["score_min"] is not None:
            key = (
                _desc_submitter(folder, e["submitter"], e["system"]),
                e["system"],
                e["scaling"],
                e["benchmark"],
            )
            scores[key] = e["score_min"]
    return (clock.wall, clock.cpu), scores


def _desc_submitter(folder: Path, org: str, system: str) -> str:
    """The summarizer names a row's submitter by the system description, not the folder."""
    org_dir = folder if folder.name == org and (folder / "results").is_dir() else folder / org
    try:
        return str(json.loads((org_dir / "systems" / f"{system}.json").read_text())["submitter"])
    except (OSError, ValueError, KeyError):
        return org


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a round's folder (of organisations) or one organisation's")
    parser.add_argument("--ruleset", required=True, help="HPC ruleset the official tools get, e.g. 3.0.0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check_speed_") as tmp:
        scratch = Path(tmp)
        ours_s, ours = run_ours(args.folder.resolve(), args.ruleset, scratch)
        official_s, csv_path = run_official(args.folder.resolve(), args.ruleset, scratch)
        theirs = official_scores(csv_path, args.ruleset)
    common = sorted(set(ours) & set(theirs))
    worst = max((abs(ours[k] - theirs[k]) for k in common), default=0.0)
    agree = sum(abs(ours[k] - theirs[k]) <= TOLERANCE_MIN for k in common)
    print(f"folder: {args.folder} (ruleset {args.ruleset})")
    print(f"{'':46} {'wall s':>8} {'CPU s':>8}")
    print(f"{'official package checker + result summarizer':46} {official_s[0]:8.1f} {official_s[1]:8.1f}")
    print(f"{'mlhpc check':46} {ours_s[0]:8.1f} {ours_s[1]:8.1f}")
    print(f"ratio: {official_s[0] / ours_s[0]:.1f}x wall clock, {official_s[1] / ours_s[1]:.1f}x CPU time")
    print(
        f"scores: {agree}/{len(theirs)} official scores matched within {TOLERANCE_MIN} min, largest difference {worst:.2e}"
    )
    for key in sorted(set(theirs) - set(ours)):
        print(f"  not scored by mlhpc: {'/'.join(key)} = {theirs[key]}")
    for key in (k for k in common if abs(ours[k] - theirs[k]) > TOLERANCE_MIN):
        print(f"  differs: {'/'.join(key)}: mlhpc {ours[key]!r}, official {theirs[key]!r}")
    return 0 if agree == len(theirs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
