"""`mlhpc run --slurm` without a cluster: the job scripts it writes, the seeds it picks, the order it
submits in. tests/test_launchers_real.py submits one to a real Slurm."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlhpc.campaign.io import read_campaign_file
from mlhpc.campaign.options import RunOptions, from_args
from mlhpc.campaign.plan import CAMPAIGN_FILE
from mlhpc.campaign.slurm import (
    SlurmCampaign,
    SlurmResources,
    campaign_request,
    check_script,
    dry_run_text,
    plan,
    scripts,
    seed_script,
    submit,
)
from mlhpc.cli import build_parser
from mlhpc.commands.run import _run_options
from mlhpc.common.errors import ConfigError, SubmissionError
from tests.conftest import cli_env

REPO = Path(__file__).resolve().parents[1]


def campaign(tmp_path: Path, **changes: object) -> SlurmCampaign:
    values: dict[str, object] = {
        "benchmark": "cosmoflow",
        "config": "mini",
        "out": tmp_path / "out",
        "submitter": "org",
        "system": "sys_n4",
        "ruleset": "3.0.0",
        "seeds": (100, 101, 102),
        "to_run": (0, 1, 2),
        "data": tmp_path / "data",
        "generate": True,
        "overrides": ("loop.max_epochs=20",),
        "options": RunOptions(
            benchmark="cosmoflow",
            overrides=("loop.max_epochs=20",),
            seeds=3,
            first_seed=100,
            out=tmp_path / "out",
            data=tmp_path / "data",
            resume=True,
        ),
        "run_and_time": REPO / "run_and_time.sh",
        "mlhpc_cmd": (sys.executable, "-m", "mlhpc"),
        "resources": SlurmResources(
            nodes=2, ntasks_per_node=2, partition="gpu", sbatch_args=("--account=abc",)
        ),
    }
    values.update(changes)
    return SlurmCampaign(**values)  # type: ignore[arg-type]


def sbatch_directives(text: str) -> list[str]:
    """The #SBATCH options sbatch reads: those before the first command."""
    found = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH "):
            found.append(line.removeprefix("#SBATCH "))
        elif line and not line.startswith("#"):
            break
    return found


def test_seed_script_asks_for_the_allocation(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    text = seed_script(c, 1)
    assert text.startswith("#!/bin/bash\n")
    assert sbatch_directives(text) == [
        "--job-name=mlhpc-cosmoflow-1",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--time=01:00:00",
        "--partition=gpu",
        f"--output={c.out}/slurm/seed_1-%j.out",
        "--account=abc",
    ]
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_seed_script_runs_run_and_time_for_its_seed(tmp_path: Path) -> None:
    """Run the script itself with DRY_RUN=1: run_and_time.sh prints the command the job would run."""
    c = campaign(tmp_path)
    script = tmp_path / "seed_2.sbatch"
    script.write_text(seed_script(c, 2))
    env = cli_env(DRY_RUN="1", SLURM_TMPDIR=str(tmp_path / "node-local"))
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[:5] == ["srun", "--kill-on-bad-exit=1", sys.executable, "-m", "mlhpc"]
    # Index 2 of the campaign whose seeds start at 100, straight into the submission, unchecked.
    ran = from_args(build_parser("run").parse_args(words[5:]))
    assert ran == replace(c.options, index=2, check=False)
    assert (ran.first_seed, ran.out, ran.data, ran.resume) == (100, c.out, c.data, True)
    assert ran.overrides == ("loop.max_epochs=20",) and ran.system is None  # settings: campaign.json


def test_check_script_checks_the_submitters_folder(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    text = check_script(c)
    assert "--ntasks=1" in sbatch_directives(text)
    command = text.strip().splitlines()[-1]
    assert shlex.split(command)[:6] == [
        sys.executable,
        "-m",
        "mlhpc",
        "check",
        str(c.out / "org"),
        "--ruleset",
    ]
    assert f"--json {c.out}/slurm/check-" in command


GPU_REQUESTS = (
    "--gpus-per-node=4",
    "--gpus=8",
    "-G 2",
    "-G2",
    "--gpus-per-task=1",
    "--cpus-per-gpu=8",
    "--mem-per-gpu=40G",
    "--gpu-bind=closest",
    "--gres=gpu:4",
    "--gres=gpu:a100:2",
    "--gres gpu",
    "--tres-per-task=gres/gpu:1",
)


def test_the_check_and_generate_jobs_ask_for_no_gpu(tmp_path: Path) -> None:
    """Issue 30: check.sbatch inherited --gpus-per-node from --sbatch-arg (an idle GPU held, or a
    wait for one). The seed jobs keep every option; the CPU jobs keep all but the GPU requests."""
    kept = ("--account=abc", "--qos=high", "--gres=nvme:1", "--constraint=gpu_node")
    c = campaign(
        tmp_path, resources=SlurmResources(sbatch_args=(*GPU_REQUESTS, *kept, "--gres=gpu:4,nvme:2"))
    )
    for name, text in scripts(c).items():
        found = sbatch_directives(text)
        if name.startswith("seed_"):
            assert all(arg in found for arg in GPU_REQUESTS)
            continue
        assert all(arg in found for arg in kept), (name, found)
        assert "--gres=nvme:2" in found, found  # the GPU entry of a list goes, the rest stays
        gpu = [arg for arg in found if "gpu" in arg.lower() and arg != "--constraint=gpu_node"]
        assert not gpu, (name, gpu)


def test_scripts_come_in_submission_order(tmp_path: Path) -> None:
    assert list(scripts(campaign(tmp_path))) == [
        "generate.sbatch",
        "seed_0.sbatch",
        "seed_1.sbatch",
        "seed_2.sbatch",
        "check.sbatch",
    ]
    resumed = campaign(tmp_path, generate=False, to_run=(1,))
    assert list(scripts(resumed)) == ["seed_1.sbatch", "check.sbatch"]
    assert "--dependency=afterany:<seed_1> " in dry_run_text(resumed)


@pytest.mark.parametrize("arg", ["account=abc", "--account=abc\n#SBATCH --x"])
def test_bad_sbatch_arg_is_refused(arg: str) -> None:
    with pytest.raises(ConfigError, match="--sbatch-arg"):
        SlurmResources(sbatch_args=(arg,))


def slurm_args(out: Path, *extra: str) -> argparse.Namespace:
    return build_parser("run").parse_args(
        ["run", "cosmoflow", "loop.max_epochs=20", "--out", str(out), "--slurm", *extra]
    )


def plan_seeds(out: Path, count: int, first_seed: int | None, resume: bool) -> tuple[list[int], list[int]]:
    """(seed of every index, indices to run) as `mlhpc run --slurm` plans them."""
    extra = ["--submitter", "org", "--system", "sys", "--seeds", str(count)]
    extra += ["--first-seed", str(first_seed)] if first_seed is not None else []
    p = plan(campaign_request(from_args(slurm_args(out, *extra, *(["--resume"] if resume else [])))))
    return list(p.seeds), list(p.to_run)


def test_random_first_seeds_differ_and_count_up(tmp_path: Path) -> None:
    picks = [plan_seeds(tmp_path, 3, None, resume=False) for _ in range(5)]
    for seeds, to_run in picks:
        assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2] and seeds[0] >= 1
        assert to_run == [0, 1, 2]
    assert len({seeds[0] for seeds, _ in picks}) > 1


def test_local_and_slurm_plan_the_same_campaign(tmp_path: Path) -> None:
    """The runner's and the submitter's requests for one command line give one plan."""
    from mlhpc.campaign.io import resolve_config
    from mlhpc.campaign.local import campaign_request as local_request

    common = ["--seeds", "3", "--first-seed", "40", "--system", "sys", "--resume"]
    write_result(tmp_path, 1, 41)  # a resumed campaign: the same kept run on both routes
    args = build_parser("run").parse_args(
        ["run", "cosmoflow", "loop.max_epochs=20", "--out", str(tmp_path), "--submitter", "org", *common]
    )
    opts = _run_options(args)
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    local = plan(local_request(opts, resolved, "strong", default_system="this_machine_n1"))
    slurm = plan(campaign_request(from_args(slurm_args(tmp_path, "--submitter", "org", *common))))
    assert (
        (local.seeds, local.to_run, local.kept)
        == (slurm.seeds, slurm.to_run, slurm.kept)
        == ((40, 41, 42), (0, 2), (1,))
    )
    assert local.config_id == slurm.config_id and local.settings == slurm.settings
    assert [local.result_path(i) for i in range(3)] == [slurm.result_path(i) for i in range(3)]
    assert local.result_path(2) == tmp_path / "org/results/sys/strong/cosmoflow/result_2.txt"
    assert local.breakdown_path(0) == slurm.breakdown_path(0) and local.data == slurm.data


def write_result(out: Path, index: int, seed: int, status: str = "success") -> Path:
    """A minimal MLLOG file that logged `seed` and ended with `status`."""
    path = out / "org" / "results" / "sys" / "strong" / "cosmoflow" / f"result_{index}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    events = [
        ("POINT_IN_TIME", "seed", seed, {}),
        ("INTERVAL_START", "run_start", None, {}),
        ("INTERVAL_END", "run_stop", None, {"status": status}),
    ]
    lines = [
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 1000 + i,
                "event_type": kind,
                "key": key,
                "value": value,
                "metadata": meta,
            }
        )
        for i, (kind, key, value, meta) in enumerate(events)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_existing_results_need_resume(tmp_path: Path) -> None:
    write_result(tmp_path, 1, 501)
    with pytest.raises(SubmissionError, match="--resume"):
        plan_seeds(tmp_path, 3, None, resume=False)


def test_resume_keeps_finished_seeds(tmp_path: Path) -> None:
    write_result(tmp_path, 1, 501)
    assert plan_seeds(tmp_path, 3, None, resume=True) == ([500, 501, 502], [0, 2])
    with pytest.raises(ConfigError, match="drop --first-seed"):
        plan_seeds(tmp_path, 3, 7, resume=True)
    with pytest.raises(ConfigError, match="--seeds"):
        plan_seeds(tmp_path, 1, None, resume=True)


def test_resume_reruns_an_unfinished_result_as_the_local_runner_does(tmp_path: Path) -> None:
    write_result(tmp_path, 0, 501, status="aborted")
    write_result(tmp_path, 1, 502)
    assert plan_seeds(tmp_path, 3, None, resume=True) == ([501, 502, 503], [0, 2])


def test_submit_chains_the_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in sbatch that records its arguments and answers with the next job id, as --parsable does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\necho $(( $(wc -l < {calls}) + 40 ))";mycluster"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    c = campaign(tmp_path, seeds=(100, 101), to_run=(0, 1))
    jobs = submit(c)
    assert (jobs.generate, jobs.seeds, jobs.check) == ("41", {0: "42", 1: "43"}, "44")
    lines = calls.read_text().splitlines()
    assert lines == [
        f"--parsable {c.out}/slurm/generate.sbatch",
        f"--parsable --dependency=afterok:41 --kill-on-invalid-dep=yes {c.out}/slurm/seed_0.sbatch",
        f"--parsable --dependency=afterok:41 --kill-on-invalid-dep=yes {c.out}/slurm/seed_1.sbatch",
        f"--parsable --dependency=afterany:42:43 {c.out}/slurm/check.sbatch",
    ]
    recorded = json.loads((c.out / "slurm" / "jobs.json").read_text())
    assert recorded["seeds"] == {"0": {"job": "42", "seed": 100}, "1": {"job": "43", "seed": 101}}


def test_submit_reports_an_sbatch_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/bash\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(SubmissionError, match="invalid partition specified"):
        submit(campaign(tmp_path))


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlhpc", *args],
        env=cli_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    args = ["run", "cosmoflow", "--slurm", "--dry-run", "--seeds", "2", "--first-seed", "9", "--out", "runs"]
    proc = cli(*args, "--slurm-nodes", "2", "--sbatch-arg=--account=abc", "loop.max_epochs=20", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "runs"
    assert f"### {out}/slurm/seed_1.sbatch" in proc.stdout
    assert "export SEED=10" in proc.stdout and "#SBATCH --account=abc" in proc.stdout
    assert "#SBATCH --nodes=2" in proc.stdout
    assert (
        f"sbatch --parsable --dependency=afterany:<seed_0>:<seed_1> {out}/slurm/check.sbatch" in proc.stdout
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--slurm", "--instances", "2"], "drop --instances"),
        (["--slurm", "--slurm-nodes", "0"], "--slurm-nodes 0"),
    ],
)
def test_cli_refuses_what_it_cannot_submit(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = cli("run", "cosmoflow", "--out", "runs", *extra, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_parser_takes_the_slurm_options() -> None:
    from mlhpc.cli import build_parser

    args = build_parser().parse_args(
        ["run", "cosmoflow", "--out", "x", "--slurm", "--sbatch-arg=--qos=high", "--sbatch-arg=--account=a"]
    )
    assert isinstance(args, argparse.Namespace)
    assert args.slurm and args.sbatch_arg == ["--qos=high", "--account=a"]
    assert (args.slurm_nodes, args.slurm_ntasks_per_node, args.slurm_time) == (1, 1, "01:00:00")


def fake_sbatch(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH with a stand-in sbatch that records its calls, and the file it records them in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\necho $(( $(wc -l < {calls}) + 40 ))\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{cli_env()['PATH']}"}, calls


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["cosmoflw"], "no benchmark 'cosmoflw'; known:"),
        (["cosmoflow", "optimizer.lrr=1"], "optimizer.lrr"),
        (["cosmoflow", "--config", "mni"], "no config 'mni'"),
    ],
)
def test_a_typo_fails_on_the_login_node_before_any_sbatch(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    env, calls = fake_sbatch(tmp_path)
    proc = cli("run", *extra, "--slurm", "--out", "runs", cwd=tmp_path, **env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not calls.exists() and not (tmp_path / "runs" / "slurm").exists()


def test_slurm_submission_records_the_campaign_and_refuses_a_second_or_a_changed_one(tmp_path: Path) -> None:
    env, calls = fake_sbatch(tmp_path)
    first = cli(
        "run", "cosmoflow", "--slurm", "--seeds", "2", "--out", "runs", "--system", "s", cwd=tmp_path, **env
    )
    assert first.returncode == 0, first.stderr
    recorded = read_campaign_file(tmp_path / "runs" / CAMPAIGN_FILE)
    assert recorded is not None and recorded.settings.system == "s"
    assert recorded.entries["cosmoflow/strong"].seeds == 2
    submitted = calls.read_text().count("\n")
    assert submitted == 4  # data, two seeds, check

    again = cli("run", "cosmoflow", "--slurm", "--seeds", "2", "--out", "runs", cwd=tmp_path, **env)
    assert again.returncode == 2 and "pass --resume" in again.stderr, again.stderr
    changed = cli(
        "run", "cosmoflow", "--slurm", "--resume", "--out", "runs", "loop.max_epochs=3", cwd=tmp_path, **env
    )
    assert changed.returncode == 2 and "pass the same --config and overrides" in changed.stderr, (
        changed.stderr
    )
    other = cli(
        "run", "cosmoflow", "--slurm", "--resume", "--out", "runs", "--system", "t", cwd=tmp_path, **env
    )
    assert other.returncode == 2 and "one --out holds one system" in other.stderr, other.stderr
    assert calls.read_text().count("\n") == submitted  # none of them reached sbatch

    resumed = cli(
        "run", "cosmoflow", "--slurm", "--resume", "--seeds", "2", "--out", "runs", cwd=tmp_path, **env
    )
    assert resumed.returncode == 0, resumed.stderr
    first_seed = recorded.entries["cosmoflow/strong"].first_seed
    assert f"seed {first_seed + 1} -> result_1.txt" in resumed.stdout  # the same campaign's seeds


def test_a_second_submission_into_a_busy_out_is_refused(tmp_path: Path) -> None:
    from tests.conftest import lock_held_elsewhere

    env, calls = fake_sbatch(tmp_path)
    out = tmp_path / "runs"
    with lock_held_elsewhere(out):
        proc = cli("run", "cosmoflow", "--slurm", "--out", str(out), cwd=tmp_path, **env)
    assert proc.returncode == 2 and "in use by" in proc.stderr, proc.stderr
    assert not calls.exists()
