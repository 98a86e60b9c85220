"""The people's channel of a run: a plain line per epoch, no MLLOG, nothing from other ranks."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.cluster.distributed import DistContext, init_distributed
from mlhpc.common.contract.catalog import Target
from mlhpc.common.training.progress import Progress, clock, epoch_line, seed_line
from tests.helpers.toy_benchmark import TOY, make_config, run_toy


@pytest.fixture(scope="module")
def ctx() -> DistContext:
    return init_distributed("gloo", "cpu")


def test_a_run_prints_one_plain_line_per_epoch_and_no_mllog(ctx: DistContext, tmp_path: Path) -> None:
    out = io.StringIO()  # not a terminal: what a batch job's output file gets
    run_toy(
        make_config(max_epochs=3), ctx, tmp_path / "result_0.txt", progress=Progress(enabled=True, stream=out)
    )
    # a slow step's note (`mlhpc: setting up ... ...`, on a busy machine) is not an epoch line
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("mlhpc: ")]
    assert lines[0].startswith("staged ")  # the toy stages nothing, but says so
    assert [line.split()[1] for line in lines[1:]] == ["1/3", "2/3", "3/3"]
    assert all("(target >= 0)" in line or "(target <= 0)" in line for line in lines[1:]), lines
    assert ":::MLLOG" not in out.getvalue() and "\x1b[" not in out.getvalue()  # no events, no colour codes
    assert ":::MLLOG" in (tmp_path / "result_0.txt").read_text()  # the events went to the result file


def test_ranks_other_than_the_main_one_print_nothing(ctx: DistContext, tmp_path: Path) -> None:
    out = io.StringIO()
    run_toy(make_config(max_epochs=2), ctx, None, progress=Progress(enabled=False, stream=out))
    assert out.getvalue() == ""


def test_epoch_line_says_how_far_from_the_target() -> None:
    line = epoch_line(
        epoch=3, max_epochs=30, target=Target(metric="eval_accuracy", direction="max"), threshold=0.82,
        value=0.77312, samples_per_s=412.54, elapsed_s=62.4,
    )  # fmt: skip
    assert line == "epoch  3/30  eval_accuracy 0.7731 (target >= 0.82)      412.5 samples/s  1:02"
    reached = epoch_line(
        epoch=4, max_epochs=30, target=Target(metric="eval_error", direction="min"), threshold=0.124,
        value=0.1, samples_per_s=1.0, elapsed_s=3725,
    )  # fmt: skip
    assert reached.endswith("1:02:05  reached") and "(target <= 0.124)" in reached
    assert (
        seed_line(seed=7, status="success", epochs=4, run_seconds=90)
        == "seed 7: success after 4 epoch(s) in 1.50 min"
    )


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False))
def test_clock_reads_back_to_the_second(seconds: float) -> None:
    parts = [int(p) for p in clock(seconds).split(":")]
    total = parts[0] * 3600 + parts[1] * 60 + parts[2] if len(parts) == 3 else parts[0] * 60 + parts[1]
    assert total == round(seconds) and all(p < 60 for p in parts[1:])


LIBRARY_NOISE = """
import logging, sys, warnings
from pathlib import Path
from mlhpc.common.display.debug_log import configure_console, debug_log
configure_console(debug=len(sys.argv) > 2)
with debug_log(Path(sys.argv[1]), rank=0) as path:
    warnings.warn("a library's notice nobody can act on", UserWarning)
    logging.getLogger("somelib").warning("somelib chatter")
    logging.getLogger("mlhpc.staging").info("removed a stale folder")
    logging.getLogger("mlhpc.staging").warning("a source file changed while staging")
print(path)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_library_warnings_go_to_the_debug_log_not_the_terminal(tmp_path: Path, debug: bool) -> None:
    import subprocess
    import sys

    args = [sys.executable, "-c", LIBRARY_NOISE, str(tmp_path), *(["debug"] if debug else [])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    log = Path(proc.stdout.strip())
    assert log.parent == tmp_path / "logs" and log.name.startswith("debug-") and log.name.endswith(".log")
    written = log.read_text()
    for line in ("a library's notice", "somelib chatter", "removed a stale folder", "a source file changed"):
        assert line in written
    assert "a source file changed while staging" in proc.stderr  # mlhpc's own warning is for the user
    for noise in ("a library's notice", "somelib chatter", "removed a stale folder"):
        assert (noise in proc.stderr) == debug, proc.stderr


def test_staging_line_reads_the_staging_metadata() -> None:
    from mlhpc.common.training.progress import staging_line

    metadata = {"staged_files": 1032, "staged_bytes": 268_400_000, "staging_duration": 2.13}
    assert staging_line(metadata) == "staged 1,032 files (268.4 MB) in 2.1 s"
    assert staging_line({}) == "staged ? files"  # a stage callable that reports nothing


# ---------------------------------------------------------------- a campaign a person can plan by
SMALL = ["data.num_train_samples=64", "data.num_eval_samples=16"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.lists(st.floats(0, 1e5, allow_nan=False), max_size=50))
def test_time_left_is_the_runs_to_go_at_the_mean_so_far(total: int, seconds: list[float]) -> None:
    from mlhpc.common.training.progress import CampaignClock

    seconds = seconds[:total]
    campaign = CampaignClock(total=total)
    for s in seconds:
        campaign.finished(s)
    line = campaign.line(len(seconds) + 1 if len(seconds) < total else total)
    assert line.startswith("seed ") and f" of {total}" in line
    if not seconds:
        assert campaign.left_s() is None and "left" not in line
    else:
        left = campaign.left_s()
        assert left is not None
        assert left == pytest.approx((total - len(seconds)) * sum(seconds) / len(seconds))
        assert f"about {clock(left)} left" in line


def test_each_seed_says_which_of_how_many_and_the_time_left(tmp_path: Path) -> None:
    """A real three-seed campaign (one epoch each, not meant to reach the target)."""
    from tests.helpers.cli import mlhpc_cli

    args = ["run", "cosmoflow", "--seeds", "3", "--out", "runs", "--no-check", "loop.max_epochs=1", *SMALL]
    proc = mlhpc_cli(args, tmp_path, 600)
    lines = proc.stdout.splitlines()
    starts = [line for line in lines if line.startswith("seed ") and " of 3" in line]
    assert starts[0] == "seed 1 of 3", proc.stdout[-3000:]
    assert len(starts) == 3 and all("left (" in line and "a seed so far)" in line for line in starts[1:])
    assert starts[1].startswith("seed 2 of 3, about ")


def test_an_interrupted_run_prints_the_command_that_finishes_it(tmp_path: Path) -> None:
    """Ctrl-C (and SIGTERM) in the second seed: one line with the exact command, which the
    planner then accepts as the campaign's resumption."""
    import shlex
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.cli import cli_env
    from tests.helpers.processes import ctrl_c_as_at_a_terminal

    for sig, how in ((signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")):
        out = f"runs {how}"  # a space: the command must come back shell-quoted
        # 64 samples never reach the target: each seed runs its 5 epochs, seconds to signal in.
        argv = ["run", "cosmoflow", "--seeds", "3", "--out", out, "--no-check", "loop.max_epochs=5", *SMALL]
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlhpc", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=cli_env(MLHPC_LOCAL_DIR=str(tmp_path / "local")), cwd=tmp_path, preexec_fn=ctrl_c_as_at_a_terminal,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 300
            for line in proc.stdout:
                if line.startswith("seed 2 of 3") or time.monotonic() > deadline:
                    break
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 128 + sig, err[-2000:]
        lines = err.splitlines()
        assert len(lines) == 1, err[-2000:]
        line = lines[0]
        prefix = f"mlhpc: {how}; to finish the campaign (finished runs are kept): "
        assert line.startswith(prefix), line
        command = shlex.split(line[len(prefix) :])
        assert command == [sys.executable, "-m", "mlhpc", *argv, "--resume"]
        check = subprocess.run(
            [*command, "--dry-run"], capture_output=True, text=True, timeout=300,
            env=cli_env(MLHPC_LOCAL_DIR=str(tmp_path / "local")), cwd=tmp_path,
        )  # fmt: skip
        assert check.returncode == 0, check.stderr[-2000:]
        assert "keeping 1 finished" in check.stdout or "seeds [" in check.stdout, check.stdout[-2000:]


def test_where_resuming_means_nothing_the_line_stays_bare() -> None:
    import argparse

    from mlhpc.cli import stopped_line

    run = {
        "command": "run",
        "dry_run": False,
        "slurm": False,
        "instances": 1,
        "argv": ["run", "x", "--out", "o"],
    }
    assert stopped_line("interrupted", argparse.Namespace(command="generate")) == "mlhpc: interrupted"
    for change in ({"dry_run": True}, {"slurm": True}, {"instances": 4}):
        assert stopped_line("terminated", argparse.Namespace(**{**run, **change})) == "mlhpc: terminated"
    resumed = stopped_line("interrupted", argparse.Namespace(**{**run, "argv": [*run["argv"], "--resume"]}))
    assert resumed.endswith("run x --out o --resume") and resumed.count("--resume") == 1


def test_a_long_epoch_says_it_is_still_training_and_a_short_one_says_nothing() -> None:
    out = io.StringIO()
    progress = Progress(enabled=True, stream=out)
    with progress.heartbeat("epoch  1/20", every_s=0.05):
        time.sleep(0.28)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 6, lines  # 5 on time; a loaded machine may wake the beat late, never early
    assert all(line.startswith("epoch  1/20  still training, 0:00 in") for line in lines), lines
    out.truncate(0)
    out.seek(0)
    with progress.heartbeat("epoch  2/20", every_s=5):
        pass
    assert out.getvalue() == ""  # quick: no line, and the thread has ended
    with Progress(enabled=False, stream=out).heartbeat("x", every_s=0.01):
        time.sleep(0.05)
    assert out.getvalue() == ""  # other ranks: nothing


def test_the_loop_says_still_training_within_each_epoch(
    ctx: DistContext, tmp_path: Path, monkeypatch
) -> None:
    from mlhpc.common.training import progress as progress_module

    def slow_step(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(0.01)  # 8 steps: an epoch of 80 ms or more, 16 heartbeats long, on any machine
        return TOY.compute_loss(model, batch)

    monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.005)
    out = io.StringIO()
    run_toy(
        make_config(max_epochs=2),
        ctx,
        tmp_path / "result_0.txt",
        bench=dataclasses.replace(TOY, compute_loss=slow_step),
        progress=Progress(enabled=True, stream=out),
    )
    beats = [line for line in out.getvalue().splitlines() if "still training" in line]
    assert {line.split("  still")[0] for line in beats} == {"epoch  1/2", "epoch  2/2"}, out.getvalue()
