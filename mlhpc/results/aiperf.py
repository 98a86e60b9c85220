"""`mlhpc report` of an AIPerf run: its score over time and its trials, printed, as JSON, and plotted
(two panels: the windows' OPS and regulated score; each finished epoch's top-1, by node)."""

from __future__ import annotations

from pathlib import Path

from mlhpc.benchmarks.aiperf.scoring import SCORE_FORMAT, RunScore, score_run
from mlhpc.common.display.plots import pyplot, write_png
from mlhpc.common.safeio.fileio import atomic_write_json
from mlhpc.common.safeio.writable import PNG_KIND, json_kind, refuse_output_over_inputs


def report_aiperf(run_dir: Path, *, plot: Path | None = None, json_path: Path | None = None) -> RunScore:
    """Print the run's trials by node and its score windows; write the plot and the JSON asked for.
    Nothing is written into the run."""
    plot = refuse_output_over_inputs(plot, [run_dir], "--plot", kind=PNG_KIND) if plot else None
    json_path = refuse_output_over_inputs(json_path, [run_dir], "--json", kind=json_kind(SCORE_FORMAT)) if json_path else None
    result = score_run(run_dir)
    print(f"AIPerf run {run_dir}: {result.nodes} nodes, {result.duration_s / 60:g} min")
    print(f"{'node':<24} {'trainings':>9} {'epochs':>6} {'best top-1':>10}")
    for node in sorted({p.node for p in result.points}):
        mine = [p for p in result.points if p.node == node]
        trainings = len({(p.arch, p.round) for p in mine})
        print(f"{node[:24]:<24} {trainings:>9} {len(mine):>6} {max(p.accuracy for p in mine):>10.4f}")
    if result.final is not None:
        print(f"final window {result.final.hours:.2f} h: {result.final.ops_per_second:.4g} OPS, "
              f"regulated score {result.final.score:.4g}, {'valid' if result.valid else 'NOT valid'}")
    if json_path is not None:
        atomic_write_json(json_path, result.to_json())
    if plot is not None:
        _plot(result, plot)
        print(f"wrote {plot}")
    return result


def _plot(result: RunScore, path: Path) -> None:
    plt = pyplot()
    fig, (score_ax, trials_ax) = plt.subplots(1, 2, figsize=(11, 4))
    hours = [w.hours for w in result.windows]
    score_ax.plot(hours, [w.ops_per_second for w in result.windows], marker="o", label="OPS")
    score_ax.plot(hours, [w.score for w in result.windows], marker="s", label="regulated score")
    score_ax.set_xlabel("window end (hours after the start)")
    score_ax.set_ylabel("operations per second")
    score_ax.set_title("AIPerf score over time")
    score_ax.legend()
    for node in sorted({p.node for p in result.points}):
        mine = [p for p in result.points if p.node == node]
        trials_ax.scatter([p.seconds / 60 for p in mine], [p.accuracy for p in mine], s=10, label=node or "?")
    trials_ax.axhline(result.threshold, color="grey", linestyle="--", label=f"threshold {result.threshold:g}")
    trials_ax.set_xlabel("minutes after the start")
    trials_ax.set_ylabel("top-1 after the epoch")
    trials_ax.set_title(f"trials: {result.trainings} trainings, {result.epochs} epochs")
    trials_ax.legend(fontsize="small")
    fig.tight_layout()
    write_png(fig, path)
