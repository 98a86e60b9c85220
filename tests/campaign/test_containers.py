"""`mlhpc run --slurm --container IMAGE`: every job's mlhpc runs in the image, through the runtime
named (or a .sif's / .sqsh's own), with --out, --data and the node-local folder bound at their
own paths. What the dry run prints is what is submitted (one graph); the seed job's LAUNCHER is
run here through bash with stand-ins for srun and the runtime that record the words they got."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import mlhpc

RUN = ("run", "cosmoflow", "--slurm", "--dry-run", "--seeds", "2", "--first-seed", "3", "--out", "runs")


def script(dry_run: str, name: str) -> str:
    """The text of the job script `name` (seed_0, generate, check) in a dry run's output."""
    (found,) = [part for part in dry_run.split("### ") if part.split("\n", 1)[0].endswith(f"/{name}.sbatch")]
    return found


def launcher(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("export LAUNCHER=")]
    return line


@pytest.fixture
def image(tmp_path: Path) -> Path:
    sif = tmp_path / "images" / "mlhpc.sif"
    sif.parent.mkdir()
    sif.write_bytes(b"not really a SIF: the dry run only names it")
    return sif


@pytest.mark.parametrize(
    ("runtime", "gpus", "expected"),
    [
        ("apptainer", True, "apptainer exec --nv --bind={out},${{MLHPC_LOCAL_DIR}} {image}"),
        ("singularity", False, "singularity exec --bind={out},${{MLHPC_LOCAL_DIR}} {image}"),
        ("pyxis", False, "--container-image={image} --container-mounts={out}:{out},${{MLHPC_LOCAL_DIR}}:${{MLHPC_LOCAL_DIR}}"),
        ("charliecloud", False, "ch-run --set-env --bind={out} --bind=${{MLHPC_LOCAL_DIR}} {image} --"),
        (
            "podman-hpc",
            True,
            "podman-hpc run --rm --network=host --gpu --env=MLHPC_LOCAL_DIR --volume={out}:{out} "
            "--volume=${{MLHPC_LOCAL_DIR}}:${{MLHPC_LOCAL_DIR}} --entrypoint=/usr/bin/env {image}",
        ),
    ],
)
def test_each_runtime_wraps_the_seed_jobs_ranks(
    tmp_path: Path, image: Path, runtime: str, gpus: bool, expected: str
) -> None:
    extra = ["--sbatch-arg=--gpus-per-node=4"] if gpus else []
    proc = mlhpc(*RUN, "--container", str(image), "--container-runtime", runtime, *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seed = script(proc.stdout, "seed_0")
    words = expected.format(out=tmp_path / "runs", image=image)
    assert launcher(seed) == f'export LAUNCHER="srun --kill-on-bad-exit=1 {words}"', seed
    assert "export MLHPC_CMD=mlhpc" in seed and "MLHPC_PYTHON" not in seed  # the image's mlhpc
    check = script(proc.stdout, "check")
    assert " mlhpc check " in check and "--nv" not in check  # the check job too, in the image, no GPU


def test_a_sif_says_its_runtime_and_a_relative_image_is_made_absolute(tmp_path: Path, image: Path) -> None:
    relative = os.path.relpath(image, tmp_path)
    proc = mlhpc(*RUN, "--container", relative, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"exec --bind={tmp_path / 'runs'},${{MLHPC_LOCAL_DIR}} {image}\"" in launcher(script(proc.stdout, "seed_0"))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--container", "with space.sif", "--container-runtime", "pyxis"], "without whitespace"),
        (["--container", "img", "--container-runtime", "pyxis", "--data", "/a:b"], "':'"),
        (["--container-runtime", "apptainer"], "add --container IMAGE"),
        (["--container", "nvcr.io/nvidia/pytorch"], "--container-runtime"),
        (["--container", "missing.sif"], "no such image here"),
    ],
)
def test_what_a_job_cannot_carry_is_one_line(tmp_path: Path, extra: list[str], needle: str) -> None:
    if "--data" in extra:
        (tmp_path / "a:b").mkdir()
        extra = [*extra[:-1], str(tmp_path / "a:b")]
    proc = mlhpc(*RUN, *extra, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_a_container_without_slurm_is_refused(tmp_path: Path, image: Path) -> None:
    proc = mlhpc("run", "cosmoflow", "--out", "runs", "--container", str(image), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "add --slurm" in proc.stderr, proc.stderr


def test_the_launcher_reaches_srun_and_the_runtime_as_these_words(tmp_path: Path, image: Path) -> None:
    """The seed job's LAUNCHER line run by bash, then split as run_and_time.sh splits it: the
    node-local folder the job found is bound, and no word is lost or joined."""
    proc = mlhpc(*RUN, "--container", str(image), cwd=tmp_path)
    line = launcher(script(proc.stdout, "seed_0"))
    shell = f'MLHPC_LOCAL_DIR=/local/job7\n{line}\nread -r -a words <<<"$LAUNCHER"\nprintf "%s\\n" "${{words[@]}}"'
    words = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()
    out = tmp_path / "runs"
    assert words == ["srun", "--kill-on-bad-exit=1", "apptainer", "exec", f"--bind={out},/local/job7", str(image)]
    assert shlex.split(line.removeprefix("export "))  # one shell word: the line is well quoted
