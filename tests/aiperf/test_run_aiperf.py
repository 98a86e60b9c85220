"""`mlhpc run aiperf` and `mlhpc check` of its run, as a user runs them: the dry run's count of the
seed, the time-to-train options it refuses, a short search on two one-rank nodes of this machine
scored and valid, and a run folder whose files were tampered with (one line naming the file)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, mlhpc, one_error_line

# AIPerf's own profiler.py on its resnet50.json (tests/aiperf/test_ops_count.py runs it).
RESNET50_OPS = {"eval": 7_806_583_495, "train": 23_053_458_315}

# A 40-second search on two nodes, scored every 0.002 h (7 s); the threshold is low because
# this test is about the mechanics, not the search's quality (perf/aiperf_scaling.py measures it).
SHORT = [
    "search.duration_minutes=0.7",
    "data.train_per_class=24",
    "data.val_per_class=8",
    "score.first_window_hours=0.002",
    "score.step_hours=0.002",
    "score.threshold=0.2",
]


def test_the_dry_run_counts_the_resnet50_seed_as_aiperfs_profiler(tmp_path: Path) -> None:
    report = tmp_path / "dry.json"
    proc = mlhpc("run", "aiperf", "--config", "full", "--out", tmp_path / "out", "--dry-run", "--json", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads(report.read_text())
    assert {k: written["ops_per_image"][k] for k in ("eval", "train")} == RESNET50_OPS
    assert written["seed_layers"] == 174 and written["image_size"] == 224
    assert not (tmp_path / "out").exists()  # a dry run writes nothing there


@pytest.mark.parametrize("flag", [["--seeds", "2"], ["--resume"], ["--index", "0"], ["--power"]])
def test_time_to_train_options_are_refused_in_one_line(tmp_path: Path, flag: list[str]) -> None:
    proc = mlhpc("run", "aiperf", "--out", tmp_path / "out", *flag)
    one_error_line(proc, flag[0])
    assert not (tmp_path / "out" / "aiperf").exists()


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("aiperf") / "out"
    proc = mlhpc("run", "aiperf", "--config", "mini", "--out", out, "--instances", "2", "--first-seed", "7",
                 *SHORT, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]  # a str: shown whole
    assert "valid: best top-1" in proc.stdout
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_two_nodes_search_together_and_the_run_is_scored_and_valid(short_run: Path, tmp_path: Path) -> None:
    run = short_run / "aiperf"
    report = tmp_path / "score.json"
    proc = mlhpc("check", short_run, "--json", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    score = json.loads(report.read_text())
    assert score["valid"] and score["best_accuracy"] >= 0.2 and score["final"]["score"] > 0
    assert score["nodes"] == 2 and len(score["windows"]) >= 5
    lines = [json.loads(line) for p in run.glob("trials/*/epochs.jsonl") for line in p.read_text().splitlines()]
    assert {line["node_index"] for line in lines} == {0, 1}  # both nodes trained and logged epochs
    assert score["epochs"] == len(lines)
    facts = json.loads((run / "aiperf.json").read_text())
    assert all(facts["start"] <= line["time"] <= facts["start"] + facts["duration_s"] for line in lines)
    first = sorted(run.glob("trials/*"))[0]
    assert json.loads((first / "model.json").read_text())["layer_list"]  # NNI's graph JSON
    assert (run / "study.journal").is_file()  # the study the nodes shared, Optuna's journal


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    return copy


def _a_log(run: Path) -> Path:
    return sorted(run.glob("aiperf/trials/*/epochs.jsonl"))[0]


def test_a_torn_last_epoch_line_is_skipped_as_a_killed_node_leaves_it(short_run: Path, tmp_path: Path) -> None:
    copy = _copy(short_run, tmp_path)
    with _a_log(copy).open("a") as log:
        log.write('{"trial": 0, "round": 0, "epo')
    proc = mlhpc("check", copy)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (lambda log: log.write_text('{"round": 0, "epoch": 1, "time": 1.0, "accuracy": 0.5}\n' + log.read_text()),
         "epochs.jsonl:1"),
        (lambda log: log.write_text(log.read_text().replace('"accuracy": 0', '"accuracy": 7', 1)), "epochs.jsonl:"),
        (lambda log: (log.parent / "model.json").write_text('{"layer_list": [[0, ["StubReLU", 1, 0]]]}'),
         "model.json"),
        (lambda log: (log.parent / "hp_0.json").write_text('{"hyperparameter": {"kernel_size": "3; rm -rf"}}'),
         "hp_0.json"),
        (lambda log: (log.parent.parent / "99999").symlink_to("/etc"), "99999"),
    ],
    ids=["time-before-start", "accuracy-7", "bad-graph", "bad-kernel", "symlinked-folder"],
)
def test_a_tampered_run_is_one_line_naming_the_file(short_run: Path, tmp_path: Path, tamper, named: str) -> None:
    copy = _copy(short_run, tmp_path)
    tamper(_a_log(copy))
    one_error_line(mlhpc("check", copy), named)


def test_the_report_plots_the_score_over_time_and_the_trials_by_node(short_run: Path, tmp_path: Path) -> None:
    plot, report = tmp_path / "aiperf.png", tmp_path / "aiperf.json"
    proc = mlhpc("report", short_run, "--plot", plot, "--json", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads(report.read_text())
    assert next(iter(written)) == "format" and written["format"] == "mlhpc-aiperf-score/1"
    assert {p["node"].split(" (")[0] for p in written["points"]} == {"node 0", "node 1"}
    assert "node 0 (" in proc.stdout and "node 1 (" in proc.stdout
    inside = short_run / "aiperf" / "plot.png"
    one_error_line(mlhpc("report", short_run, "--plot", inside), "--plot")
    assert not inside.exists()


def test_a_node_of_two_ranks_trains_its_trial_data_parallel(tmp_path: Path) -> None:
    """torchrun's two ranks are one node: its trials run with DDP over both, rank 0 logs them."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "mlhpc",
            "run", "aiperf", "--config", "mini", "--out", str(out), "--first-seed", "3", *SHORT]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=cli_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]  # a str: shown whole
    lines = [json.loads(line) for p in out.glob("aiperf/trials/*/epochs.jsonl") for line in p.read_text().splitlines()]
    assert lines and {line["node_index"] for line in lines} == {0}
    assert len(lines) == len({(line["trial"], line["round"], line["epoch"]) for line in lines})  # logged once
    assert "this node ran" in proc.stdout and "valid: best top-1" in proc.stdout


def test_the_slurm_dry_run_prints_one_job_of_every_node(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = mlhpc("run", "aiperf", "--config", "mini", "--out", out, "--slurm", "--slurm-nodes", "4",
                 "--slurm-ntasks-per-node", "2", "--dry-run", "search.duration_minutes=30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = proc.stdout
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "srun --kill-on-bad-exit=0 --no-kill" in script and "search.duration_minutes=30" in script
    assert f" check {out}" in script and not out.exists()
    bad = mlhpc("run", "aiperf", "--out", tmp_path / "o", "--slurm", "--dry-run", "--slurm-time", "1:00\n#SBATCH x")
    one_error_line(bad, "--slurm-time")


def test_the_slurm_job_runs_every_node_and_the_check_in_the_container(tmp_path: Path) -> None:
    """--container: each node's ranks run the image's mlhpc (srun, then the runtime's words), with
    --out and --data bound at their own paths; the check runs in one task of it, without GPUs."""
    out, data, image = tmp_path / "out", tmp_path / "imagenet", tmp_path / "mlhpc.sif"
    data.mkdir()
    image.write_bytes(b"")
    proc = mlhpc("run", "aiperf", "--config", "mini", "--out", out, "--data", data, "--slurm", "--slurm-nodes",
                 "2", "--container", image, "--sbatch-arg=--gpus-per-node=4", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = [line for line in proc.stdout.splitlines() if line.startswith("srun --kill-on-bad-exit=0")]
    assert step.startswith(f"srun --kill-on-bad-exit=0 --no-kill apptainer exec --nv --bind={data},{out} {image} "
                           "mlhpc run aiperf ")
    (check,) = [line for line in proc.stdout.splitlines() if " check " in line]
    assert check.startswith(f"srun --ntasks=1 apptainer exec --bind={data},{out} {image} mlhpc check {out} ")
    within = tmp_path / "o2"  # --data inside --out: --out alone is bound
    (within / "imagenet").mkdir(parents=True)
    pyxis = mlhpc("run", "aiperf", "--config", "mini", "--out", within, "--slurm", "--dry-run",
                  "--container", "docker://site/mlhpc:1", "--data", within / "imagenet")
    assert pyxis.returncode == 0, pyxis.stderr[-2000:]
    mounts = f"--container-image=docker://site/mlhpc:1 --container-mounts={within}:{within} mlhpc "
    assert f"srun --kill-on-bad-exit=0 --no-kill {mounts}run aiperf" in pyxis.stdout
    assert f"srun --ntasks=1 {mounts}check {within}" in pyxis.stdout
    local = mlhpc("run", "aiperf", "--config", "mini", "--out", tmp_path / "o3", "--container", image)
    one_error_line(local, "--slurm")


@pytest.mark.parametrize("slurm", [[], ["--slurm"]], ids=["here", "slurm"])
def test_a_second_run_into_a_finished_runs_folder_is_refused(short_run: Path, slurm: list[str]) -> None:
    before = sorted(p.name for p in (short_run / "aiperf" / "trials").iterdir())
    proc = mlhpc("run", "aiperf", "--config", "mini", "--out", short_run, *slurm, *SHORT)
    one_error_line(proc, str(short_run))
    assert sorted(p.name for p in (short_run / "aiperf" / "trials").iterdir()) == before
