"""The cluster-use files: run_and_time.sh, Dockerfile, mlhpc.def, the Slurm example and install scripts."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.campaign.seeds import seed_of
from tests.helpers.cli import RUN_AND_TIME_INPUTS, cli_env
from tests.helpers.mllog_files import mllog_events

REPO = Path(__file__).resolve().parents[2]
RUN_AND_TIME = REPO / "run_and_time.sh"
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
BASH = shutil.which("bash") or "/bin/bash"
REQUIRED_SCRIPTS = ("run_and_time.sh", "scripts/install_horovod.sh", "scripts/slurm/train.sbatch")
# Small enough for ~15 s on 2 CPU cores, large enough to reach MAE 0.124 in 4-5 of the 12 epochs
# (256 or 512 samples need more epochs than 12 with the mini schedule).
TINY = "data.num_train_samples=1024 data.num_eval_samples=64 loop.max_epochs=12"
RESULT_LINE = re.compile(r"^RESULT,cosmoflow,(\d+),(\d+),([^,]+),(.+)$", re.MULTILINE)
# The file mlhpc writes the run's seed to: under OUT, named for the run (index, host, pid, start).
SEED_FILE = re.compile(r"^(?P<out>.+)/\.mlhpc-runs/run_and_time-(?P<index>\d+)-[^/]+-\d+-\d+\.seed$")
# The command line a --slurm seed job gives (slurm_graph.seed_argv): run_and_time.sh adds nothing.
SEED_JOB_ARGS = (
    "run",
    "cosmoflow",
    "--config",
    "mini",
    "--index",
    "3",
    "--first-seed",
    "9",
    "--out",
    "/runs/x",
)
DOCKER_INSTRUCTIONS = frozenset(
    [
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    ]
)


def shell_env(**extra: str) -> dict[str, str]:
    """cli_env without run_and_time.sh's own inputs inherited from the caller."""
    env = cli_env()
    for key in RUN_AND_TIME_INPUTS:
        env.pop(key, None)
    env.update(extra)
    return env


def run_script(
    script: Path, env: dict[str, str], timeout: float = 60, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(script), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def dry_run(*args: str, **extra: str) -> list[str]:
    """The command run_and_time.sh would run, split back into words."""
    proc = run_script(RUN_AND_TIME, shell_env(DRY_RUN="1", **extra), args=args)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


def seed_file_of(words: list[str]) -> re.Match[str]:
    """The --seed-file the by-hand command passes, checked to be the run's own file under OUT."""
    assert words.count("--seed-file") == 1, words
    match = SEED_FILE.match(words[words.index("--seed-file") + 1])
    assert match, words
    return match


def run_stop(path: Path) -> dict:
    stops = [e for e in mllog_events(path) if e["key"] == "run_stop"]
    assert len(stops) == 1, f"{path}: {len(stops)} run_stop events"
    return stops[0]


def logged_seed(path: Path) -> int:
    return next(e["value"] for e in mllog_events(path) if e["key"] == "seed")


# ---------------------------------------------------------------------------------------------
# Shell scripts


def shell_scripts() -> list[str]:
    found = {*REQUIRED_SCRIPTS}
    for pattern in ("*.sh", "*.sbatch"):
        found |= {str(p.relative_to(REPO)) for p in REPO.glob(pattern)}
        found |= {str(p.relative_to(REPO)) for p in (REPO / "scripts").rglob(pattern)}
    return sorted(found)


@pytest.mark.parametrize("name", shell_scripts())
def test_shell_script_parses(name: str) -> None:
    path = REPO / name
    assert path.is_file(), f"{name} is missing"
    proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert path.read_text().startswith("#!"), f"{name} has no shebang line"


@pytest.mark.parametrize("name", ["run_and_time.sh", "scripts/install_horovod.sh"])
def test_script_is_strict_and_executable(name: str) -> None:
    path = REPO / name
    assert os.access(path, os.X_OK), f"{name} is not executable (chmod +x)"
    assert re.search(r"^set -euo pipefail$", path.read_text(), re.MULTILINE)


# ---------------------------------------------------------------------------------------------
# run_and_time.sh: the command it builds (DRY_RUN=1, nothing runs)


def test_dry_run_builds_one_run_command() -> None:
    words = dry_run(FIRST_SEED="7", OUT="/runs/x")
    file = seed_file_of(words)
    assert (file["out"], file["index"]) == ("/runs/x", "0")
    assert words == [
        "mlhpc",
        "run",
        "cosmoflow",
        "--config",
        "mini",
        "--index",
        "0",
        "--first-seed",
        "7",
        "--out",
        "/runs/x",
        "--no-check",
        "--seed-file",
        file.group(0),
    ]


def test_dry_run_passes_data_and_extra_args_verbatim() -> None:
    words = dry_run(
        FIRST_SEED="3",
        OUT="/runs/x",
        CONFIG="full",
        BENCHMARK="other",
        DATA="/data/with space",
        EXTRA_ARGS="optimizer.decay_boundary_epochs=[8,10]  --device cpu",
    )
    assert words[:5] == ["mlhpc", "run", "other", "--config", "full"]
    assert words[words.index("--data") + 1] == "/data/with space"
    assert words[-3:] == ["optimizer.decay_boundary_epochs=[8,10]", "--device", "cpu"]


@pytest.mark.parametrize(
    ("launcher", "prefix"),
    [
        (
            "torchrun --standalone --nproc_per_node=2",
            ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "mlhpc"],
        ),
        (
            "srun python -m torch.distributed.run --nproc_per_node=4",
            ["srun", "python", "-m", "torch.distributed.run", "--nproc_per_node=4", "-m", "mlhpc"],
        ),
        ("srun", ["srun", "mlhpc"]),
        ("mpirun -np 2", ["mpirun", "-np", "2", "mlhpc"]),
    ],
)
def test_dry_run_launcher_prefix(launcher: str, prefix: list[str]) -> None:
    words = dry_run(RUN_INDEX="1", OUT="/runs/x", LAUNCHER=launcher)
    assert words[: len(prefix) + 1] == [*prefix, "run"]


def test_dry_run_without_mlhpc_on_path_uses_python_module(tmp_path: Path) -> None:
    words = dry_run(OUT="/runs/x", PATH=str(tmp_path), PYTHON=sys.executable)
    assert words[:4] == [sys.executable, "-m", "mlhpc", "run"]


def test_dry_run_with_run_index_runs_that_index_straight_into_out() -> None:
    words = dry_run(FIRST_SEED="1", OUT="/runs/x", RUN_INDEX="4")
    assert words[words.index("--out") + 1] == "/runs/x"
    assert words[words.index("--index") + 1] == "4"
    assert words[words.index("--first-seed") + 1] == "1"  # passed on as given: the planner maps index to seed
    assert seed_file_of(words)["index"] == "4"


def test_dry_run_without_first_seed_leaves_the_seed_to_the_planner() -> None:
    """No FIRST_SEED: mlhpc takes OUT/campaign.json's first seed or draws one; the script draws none."""
    words = dry_run(OUT="/runs/x", RUN_INDEX="2")
    assert "--first-seed" not in words and "--seed" not in words
    assert seed_file_of(words)["out"] == "/runs/x"
    code = "\n".join(line.split("#", 1)[0] for line in RUN_AND_TIME.read_text().splitlines())
    for word in ("RANDOM", "urandom", "shuf"):
        assert word not in code, word


def test_dry_run_of_a_seed_job_runs_its_command_line_as_given() -> None:
    """A --slurm seed job exports SEED (the planner's seed, for the RESULT line) and gives the whole
    command line: the script adds no --seed-file and reads none of the variables that build one."""
    words = dry_run(
        *SEED_JOB_ARGS,
        SEED="12",
        LAUNCHER="srun --kill-on-bad-exit=1",
        OUT="/elsewhere",
        RUN_INDEX="0",
        FIRST_SEED="1",
        EXTRA_ARGS="--device cpu",
    )
    assert words == ["srun", "--kill-on-bad-exit=1", "mlhpc", *SEED_JOB_ARGS]


def test_a_seed_job_prints_its_seed_in_the_result_line(tmp_path: Path) -> None:
    """The command really runs (`true` stands for mlhpc): RESULT names the SEED the job exported,
    and nothing is written under OUT."""
    env = shell_env(SEED="12", MLHPC_CMD=shutil.which("true") or "/bin/true", OUT=str(tmp_path / "out"))
    proc = run_script(RUN_AND_TIME, env, args=SEED_JOB_ARGS)
    assert proc.returncode == 0, proc.stderr
    assert [m.group(1) for m in RESULT_LINE.finditer(proc.stdout)] == ["12"]
    assert not (tmp_path / "out").exists()


def test_run_and_time_lays_out_nothing() -> None:
    """A thin timing wrapper: mlhpc writes the result into the submission, the script moves,
    links, globs or removes no file (mlhpc never deletes what it cannot prove it created)."""
    code = "\n".join(line.split("#", 1)[0] for line in RUN_AND_TIME.read_text().splitlines())
    for word in ("rm ", "mv ", "ln ", "cp ", "find ", "unlink", "results/", "shopt", "mkdir"):
        assert word not in code, word


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"OUT": ""}, "set OUT"),
        ({"OUT": "/runs/x", "RUN_INDEX": "01"}, "RUN_INDEX=01 must be 0, 1, 2, ..."),
        ({"OUT": "/runs/x", "RUN_INDEX": "-1"}, "RUN_INDEX=-1 must be 0, 1, 2, ..."),
        ({"OUT": "/runs/x", "RUN_INDEX": "abc"}, "RUN_INDEX=abc must be 0, 1, 2, ..."),
    ],
)
def test_bad_environment_is_exit_2(extra: dict[str, str], message: str) -> None:
    proc = run_script(RUN_AND_TIME, shell_env(MLHPC_CMD=shutil.which("true") or "/bin/true", **extra))
    assert proc.returncode == 2
    assert "STARTING" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert message in line


@pytest.mark.parametrize("extra", [{}, {"RUN_INDEX": "2"}, {"RUN_INDEX": "2", "FIRST_SEED": "5"}])
def test_a_seed_by_hand_is_refused_in_one_line(tmp_path: Path, extra: dict[str, str]) -> None:
    """By hand the seed is the planner's for RUN_INDEX: a SEED would have to be turned into the
    campaign's first seed, which the script never works out. Refused before anything runs."""
    out = tmp_path / "out"
    env = shell_env(SEED="7", OUT=str(out), MLHPC_CMD=shutil.which("true") or "/bin/true", **extra)
    proc = run_script(RUN_AND_TIME, env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "run_and_time.sh: SEED=7: by hand the seed is mlhpc's (the planner's for RUN_INDEX); "
        "set FIRST_SEED, the campaign's first seed, or nothing"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        ("", "with a command line given, set SEED to its run's seed"),
        ("0", "SEED=0 must be a positive integer"),
        ("abc", "SEED=abc must be a positive integer"),
    ],
)
def test_a_seed_job_without_a_valid_seed_is_exit_2(seed: str, message: str) -> None:
    env = shell_env(MLHPC_CMD=shutil.which("true") or "/bin/true", **({"SEED": seed} if seed else {}))
    proc = run_script(RUN_AND_TIME, env, args=SEED_JOB_ARGS)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert message in line


def test_taken_run_index_is_refused_by_mlhpc(tmp_path: Path) -> None:
    """An unfinished result at the index: mlhpc refuses it (it reruns one only with --resume)."""
    taken = tmp_path / "mlhpc" / "results" / "sys" / "strong" / "cosmoflow" / "result_3.txt"
    taken.parent.mkdir(parents=True)
    taken.write_text("")
    (tmp_path / "campaign.json").write_text(json.dumps({"settings": {"system": "sys"}}))
    proc = run_script(RUN_AND_TIME, shell_env(OUT=str(tmp_path), RUN_INDEX="3"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "result_3.txt of the cosmoflow strong-scaling campaign" in proc.stderr
    assert "pass --resume" in proc.stderr
    assert taken.read_text() == ""
    assert "RESULT," not in proc.stdout


# ---------------------------------------------------------------------------------------------
# run_and_time.sh end to end: index 0 from FIRST_SEED=7 straight into OUT, then RUN_INDEX=1, whose
# first seed is the campaign file's


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("run_and_time") / "out"
    env = shell_env(BENCHMARK="cosmoflow", CONFIG="mini", FIRST_SEED="7", OUT=str(out), EXTRA_ARGS=TINY)
    return run_script(RUN_AND_TIME, env, timeout=600), out


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


@pytest.mark.slow
def test_run_and_time_runs_one_seed(first_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = first_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "STARTING TIMING RUN AT" in proc.stdout
    assert "ENDING TIMING RUN AT" in proc.stdout
    match = RESULT_LINE.search(proc.stdout)
    assert match, proc.stdout[-2000:]
    assert int(match.group(1)) == seed_of(7, 0)
    assert int(match.group(2)) >= 0
    log = only(list(out.glob("mlhpc/results/*/strong/cosmoflow/result_0.txt")))
    assert '"key": "run_stop"' in log.read_text()
    assert run_stop(log)["metadata"]["status"] == "success"
    assert logged_seed(log) == seed_of(7, 0)


@pytest.mark.slow
def test_run_and_time_files_an_indexed_run(first_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = first_run
    assert proc.returncode == 0, "the first run failed"
    data = out / "datasets" / "cosmoflow-mini"
    env = shell_env(OUT=str(out), RUN_INDEX="1", DATA=str(data), EXTRA_ARGS=TINY)
    second = run_script(RUN_AND_TIME, env, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert int(RESULT_LINE.search(second.stdout).group(1)) == seed_of(7, 1)
    logs = sorted(out.glob("mlhpc/results/*/strong/cosmoflow/result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    assert run_stop(logs[1])["metadata"]["status"] == "success"
    assert logged_seed(logs[1]) == seed_of(7, 1)
    assert logged_seed(logs[0]) == seed_of(7, 0), "the first run's log was touched"
    assert not (out / ".run_and_time").exists()
    # The seed files mlhpc wrote back stay, each the run's own (by index) holding its seed.
    left = {SEED_FILE.match(str(p))["index"]: p.read_text() for p in (out / ".mlhpc-runs").glob("*.seed")}
    assert left == {"0": f"{seed_of(7, 0)}\n", "1": f"{seed_of(7, 1)}\n"}
    # Each run's time breakdown sits beside the submission under the run's own index.
    breakdowns = sorted(out.glob("breakdown/mlhpc/*/strong/cosmoflow/result_*.json"))
    assert [p.name for p in breakdowns] == ["result_0.json", "result_1.json"]
    assert json.loads(breakdowns[1].read_text())["seed"] == seed_of(7, 1)
    # The same index again is refused before anything runs.
    again = run_script(RUN_AND_TIME, env)
    assert again.returncode == 2
    assert "already exists" in again.stderr


# ---------------------------------------------------------------------------------------------
# Dockerfile and .dockerignore


def docker_instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, args = text.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return instructions


def test_dockerfile_instructions_are_known() -> None:
    instructions = docker_instructions(REPO / "Dockerfile")
    unknown = [k for k, _ in instructions if k not in DOCKER_INSTRUCTIONS]
    assert not unknown, f"unknown Dockerfile instructions: {unknown}"
    keywords = [k for k, _ in instructions]
    assert keywords[0] == "ARG", "the base image is a build argument declared before FROM"
    assert instructions[0][1] == "BASE_IMAGE=python:3.11-slim"
    assert keywords.count("FROM") == 1
    assert dict(instructions)["FROM"] == "${BASE_IMAGE}"
    args = {a.split("=", 1)[0] for k, a in instructions if k == "ARG"}
    assert {"BASE_IMAGE", "TORCH", "WITH_MPI", "WITH_DALI"} <= args
    entrypoints = [json.loads(a) for k, a in instructions if k == "ENTRYPOINT"]
    assert entrypoints == [["mlhpc"]]
    run_text = " ".join(a for k, a in instructions if k == "RUN")
    assert 'scripts/image_install.sh /src "$TORCH" "$WITH_MPI" "$WITH_DALI"' in run_text


def test_both_images_install_through_the_one_recipe_with_the_same_defaults() -> None:
    """The Dockerfile and mlhpc.def both run scripts/image_install.sh, with the same build
    arguments and defaults: the two images cannot drift apart."""
    docker = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in docker_instructions(REPO / "Dockerfile")
              if k == "ARG" and "=" in a}
    _, sections = def_sections(REPO / "mlhpc.def")
    apptainer = dict(line.strip().split("=", 1) for line in sections["arguments"].splitlines() if "=" in line)
    assert apptainer == {k: docker[k] for k in ("TORCH", "WITH_MPI", "WITH_DALI")}
    assert 'image_install.sh /src "{{ TORCH }}" "{{ WITH_MPI }}" "{{ WITH_DALI }}"' in sections["post"]


@pytest.mark.parametrize("torch", ["cu", "cuda12", "pypi; rm -rf /", "ftp://mirror/simple"])
def test_the_image_recipe_refuses_an_unknown_torch_build_before_it_changes_anything(
    tmp_path: Path, torch: str
) -> None:
    proc = subprocess.run(
        ["sh", str(REPO / "scripts" / "image_install.sh"), str(tmp_path), torch, "1", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"TORCH={torch}: give pypi, cpu, cu126, cu128 or an index URL" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_dockerfile_copies_existing_sources() -> None:
    for keyword, args in docker_instructions(REPO / "Dockerfile"):
        if keyword in ("COPY", "ADD"):
            *sources, _dest = shlex.split(args)
            for source in sources:
                if not source.startswith("--"):
                    assert (REPO / source).exists(), f"{keyword} {source}: not in the repo"


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = {line.strip().strip("/") for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".venv", "runs", "data", ".git"} <= patterns


def test_dockerfile_converts_with_spython() -> None:
    pytest.importorskip("spython", reason="spython is not installed (pip install spython)")
    from spython.main.parse.parsers import DockerParser
    from spython.main.parse.writers import SingularityWriter

    definition = SingularityWriter(DockerParser(str(REPO / "Dockerfile")).recipe).convert()
    assert "From: python:3.11-slim" in definition
    assert "%post" in definition and "%runscript" in definition
    assert "mlhpc" in definition.split("%runscript", 1)[1]


# ---------------------------------------------------------------------------------------------
# Apptainer definition


def def_sections(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The header (Bootstrap, From, ...) and the body of each %section."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in path.read_text().splitlines():
        if line.startswith("%"):
            current = line.split()[0][1:]
            assert current not in sections, f"%{current} appears twice"
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif ":" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
    return header, {name: "\n".join(body) for name, body in sections.items()}


def test_apptainer_def_has_required_sections() -> None:
    header, sections = def_sections(REPO / "mlhpc.def")
    assert header.get("Bootstrap") in ("docker", "docker-daemon", "localimage")
    assert header.get("From")
    assert {"post", "environment", "runscript", "files"} <= sections.keys()
    assert re.search(r'^\s*exec mlhpc "\$@"\s*$', sections["runscript"], re.MULTILINE)
    # Apptainer evaluates %environment without the host's SLURM_TMPDIR: a default set there pins
    # /tmp and hides the scheduler's node-local folder from mlhpc's own lookup (issue 41).
    assert not re.search(r"^\s*export\s+MLHPC_LOCAL_DIR\b", sections["environment"], re.MULTILINE)
    for line in sections["files"].splitlines():
        if line.strip() and not line.strip().startswith("#"):
            source = line.split()[0]
            assert (REPO / source).exists(), f"%files {source}: not in the repo"


@pytest.mark.parametrize("section", ["post", "environment", "runscript", "test"])
def test_apptainer_def_sections_are_valid_sh(section: str) -> None:
    _, sections = def_sections(REPO / "mlhpc.def")
    proc = subprocess.run(["sh", "-n"], input=sections[section], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "/tmp"),
        ({"SLURM_TMPDIR": "/local/job1"}, "/local/job1"),
        ({"SLURM_TMPDIR": "/local/job1", "MLHPC_LOCAL_DIR": "/nvme"}, "/nvme"),
    ],
)
def test_apptainer_environment_leaves_the_local_dir_to_mlhpc(given: dict[str, str], expected: str) -> None:
    """The image's %environment, then mlhpc's own lookup, as a job inside the image runs them:
    the scheduler's folder or MLHPC_LOCAL_DIR wins, /tmp only without either. (%environment once
    set a shell default there, which Apptainer 1.4.5 evaluated without the host's SLURM_TMPDIR.)"""
    _, sections = def_sections(REPO / "mlhpc.def")
    lookup = "from mlhpc.staging import resolve_local_dir; print(resolve_local_dir(None), end='')"
    script = sections["environment"] + f'\nexec "{sys.executable}" -c "{lookup}"\n'
    env = {**cli_env(), "TMPDIR": "/tmp", **given}
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout == expected


# ---------------------------------------------------------------------------------------------
# Slurm example


def test_sbatch_example_has_the_expected_shape() -> None:
    text = SBATCH.read_text()
    directives = re.findall(r"^#SBATCH\s+(\S+)", text, re.MULTILINE)
    assert any(d in ("-N", "--nodes") or d.startswith("--nodes=") for d in directives)
    assert any(d.startswith("--ntasks-per-node") for d in directives)
    assert any(d.startswith("--time") for d in directives)
    assert re.search(r"^##SBATCH\s+--gpus-per-node", text, re.MULTILINE), "GPU line, commented out"
    assert re.search(r"^export MLHPC_LOCAL_DIR=", text, re.MULTILINE)
    assert re.search(r"^srun\b.*\\\n\s+mlhpc run ", text, re.MULTILINE)
    assert re.search(r"^#\s+apptainer exec --nv .*mlhpc\.sif", text, re.MULTILINE)


# The template trains for real under a test-started Slurm in tests/cluster/test_launchers_real.py.
