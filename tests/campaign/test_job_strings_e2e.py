"""Issue 39 end to end: `mlhpc run --slurm` as a user runs it, a recording sbatch (a real program)
on PATH. A hostile --out or partition is refused by the dry run and the submission alike, before
any sbatch; a `%` in --out reaches sbatch as a literal `%`; a refused sbatch is a non-zero exit
that cancels the jobs already queued; a seed job's command runs with a Python whose path has a
space; --instances beyond this machine is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.campaign import machine
from mlhpc.campaign.options import check_instances
from mlhpc.campaign.slurm_graph import JobTools, SlurmResources
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import cli_env, mlhpc

REPO = Path(__file__).resolve().parents[2]


def recording(tmp_path: Path, refuse_after: int | None = None) -> tuple[dict[str, str], Path, Path]:
    """PATH with a stand-in sbatch (records each call's argv and script; refuses call number
    `refuse_after + 1`) and scancel (records its argv): (env, sbatch calls, scancel calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls, cancels = tmp_path / "sbatch.txt", tmp_path / "scancel.txt"
    refuse = (
        ""
        if refuse_after is None
        else f'[ "$n" -gt {refuse_after} ] && {{ echo "sbatch: error: Batch job submission failed: Invalid partition" >&2; exit 1; }}\n'
    )
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'printf "%q " "$@" >> {calls}; echo >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f"{refuse}"
        f'cp "${{@: -1}}" {tmp_path}/script_$n.txt\n'
        'echo "$((n + 40));cluster"\n'
    )
    (bin_dir / "scancel").write_text(f'#!/bin/bash\necho "$*" >> {cancels}\n')
    for name in ("sbatch", "scancel"):
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{cli_env()['PATH']}"}, calls, cancels


RUN = ("run", "cosmoflow", "--seeds", "2", "--first-seed", "9", "--slurm")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--out", "runs\nhostname"], "--out"),
        (["--out", "runs x"], "--out"),
        (["--out", "runs", "--slurm-partition", "gpu\n#SBATCH --output=/tmp/x"], "--slurm-partition"),
        (["--out", "runs", "--slurm-time", "01:00:00\nid"], "--slurm-time"),
        (["--out", "a\\b"], "--out"),
    ],
)
def test_the_dry_run_refuses_what_the_submission_refuses(
    tmp_path: Path, extra: list[str], named: str
) -> None:
    env, calls, _ = recording(tmp_path)
    dry = mlhpc(*RUN, "--dry-run", *extra, cwd=tmp_path, **env)
    real = mlhpc(*RUN, *extra, cwd=tmp_path, **env)
    for proc in (dry, real):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert named in line and "Traceback" not in line
    assert dry.stderr == real.stderr
    assert not calls.exists(), "nothing reaches sbatch"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"], "nothing is written"


def test_a_percent_in_out_reaches_sbatch_as_a_literal_percent(tmp_path: Path) -> None:
    env, calls, _ = recording(tmp_path)
    proc = mlhpc(*RUN, "--out", "runs%u", cwd=tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "runs%u").resolve()
    scripts = sorted(tmp_path.glob("script_*.txt"))
    assert len(scripts) == len(calls.read_text().splitlines()) == 4  # generate, 2 seeds, check
    for script in scripts:
        text = script.read_text()
        assert f"#SBATCH --output={str(out).replace('%', '%%')}/slurm/" in text
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_a_refused_sbatch_exits_non_zero_and_cancels_what_it_queued(tmp_path: Path) -> None:
    env, _, cancels = recording(tmp_path, refuse_after=2)
    proc = mlhpc(*RUN, "--out", "runs", cwd=tmp_path, **env)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "Invalid partition" in line and "cancelled the jobs submitted before it (41 42)" in line
    assert cancels.read_text().split() == ["41", "42"]
    assert not (tmp_path / "runs" / "slurm" / "jobs.json").exists()


def test_a_seed_job_runs_with_a_python_whose_path_has_a_space(tmp_path: Path) -> None:
    """Before, run_and_time.sh split MLHPC_CMD on spaces: every seed job exited 127. The seed
    script runs for real; its srun is a stand-in that starts the command it was given, and the
    Python (under a folder with a space) runs `-m mlhpc --version`-like work: its argv."""
    from mlhpc.campaign.io import plan_out
    from mlhpc.campaign.options import RunOptions
    from mlhpc.campaign.prepare import prepare
    from mlhpc.campaign.slurm import absolute, slurm_request
    from mlhpc.campaign.slurm_graph import build_graph

    spaced = tmp_path / "my python"
    spaced.mkdir()
    python = spaced / "python3"  # the venv's Python behind a path with a space (a link would lose the venv)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv.txt"
    # srun: drop its own options, then run the program with `-c` printing the words it was given.
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        "while [[ $1 == -* ]]; do shift; done\n"
        f'prog=$1; shift; printf "%s\\n" "$prog" "$@" > {argv_file}\n'
        '"$prog" -c "import mlhpc, sys; print(\'mlhpc imported by\', sys.executable)"\n'
    )
    (bin_dir / "srun").chmod(0o755)
    opts = absolute(
        RunOptions(benchmark="cosmoflow", first_seed=3, out=tmp_path / "out", submitter="o", system="s")
    )
    tools = JobTools(run_and_time=REPO / "run_and_time.sh", mlhpc_cmd=(str(python), "-m", "mlhpc"))
    g = build_graph(opts, plan_out(slurm_request(prepare(opts))), SlurmResources(), tools, generate=False)
    script = tmp_path / "seed_0.sbatch"
    script.write_text(g.jobs[0].script)
    env = cli_env(SLURM_TMPDIR=str(tmp_path / "local"))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"mlhpc imported by {sys.executable}" in proc.stdout
    words = argv_file.read_text().splitlines()
    assert words[:3] == [str(python), "-m", "mlhpc"] and words[3:5] == ["run", "cosmoflow"]
    assert "RESULT,cosmoflow,3," in proc.stdout


def test_instances_beyond_the_machine_are_refused_by_the_dry_run(tmp_path: Path) -> None:
    proc = mlhpc("run", "cosmoflow", "--instances", "10000", "--out", "runs", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "--instances 10000" in line and "this machine holds" in line and "pass --instances" in line
    assert not (tmp_path / "runs").exists()


def test_the_instance_bound_is_the_tighter_of_cpus_and_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpus = machine.cpu_budget(look_s=0).cpus
    monkeypatch.setattr(machine, "memory_bytes", lambda: 1 << 40)
    assert machine.local_process_limit().most == cpus * machine.RANKS_PER_CPU
    check_instances(cpus * machine.RANKS_PER_CPU)
    with pytest.raises(ConfigError, match="CPUs"):
        check_instances(cpus * machine.RANKS_PER_CPU + 1)
    monkeypatch.setattr(machine, "memory_bytes", lambda: 3 << 30)
    limit = machine.local_process_limit()
    assert limit.most == min(3, cpus * machine.RANKS_PER_CPU)
    if cpus * machine.RANKS_PER_CPU > 3:
        with pytest.raises(ConfigError, match="GiB of memory"):
            check_instances(4)
    # Under a launcher the ranks are the launcher's: no local bound.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    check_instances(10**6)


def test_a_cgroup_memory_limit_cuts_the_machines_memory(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{2 << 30}\n")
    assert machine.memory_bytes(tmp_path) == 2 << 30
    (tmp_path / "memory.max").write_text("max\n")
    total = machine.memory_bytes(tmp_path)
    assert total is not None and total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_launch_instances_refuses_before_it_starts_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The self-launch checks again where the ranks start (a caller that skipped check_options)."""
    from mlhpc.campaign.instances import launch_instances
    from mlhpc.campaign.options import RunOptions

    monkeypatch.setattr(machine, "local_process_limit", lambda: machine.LocalLimit(2, "a test's 2"))
    started: list[object] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ConfigError, match=r"--instances 3 .*pass --instances 2 or fewer"):
        launch_instances(RunOptions(benchmark="cosmoflow", out=tmp_path / "o", instances=3))
    assert started == [] and not (tmp_path / "o").exists()
