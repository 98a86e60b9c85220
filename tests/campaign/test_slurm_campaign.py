"""`mlhpc run --slurm` without a cluster: the job graph it builds (scripts, resources, dependencies),
the seeds it picks, and that the dry run prints exactly what the submitter submits.
tests/cluster/test_launchers_real.py submits one to a real Slurm."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlhpc.campaign.io import campaign_request, plan_out, read_campaign_file, resolve_config
from mlhpc.campaign.options import RunOptions, from_args
from mlhpc.campaign.plan import CAMPAIGN_FILE, CampaignPlan
from mlhpc.campaign.prepare import prepare
from mlhpc.campaign.slurm import absolute, slurm_request, submit
from mlhpc.campaign.slurm_graph import JobTools, SlurmGraph, SlurmJob, SlurmResources, build_graph, seed_argv
from mlhpc.cli import build_parser
from mlhpc.common.errors import ConfigError, SubmissionError
from tests.helpers.cli import cli_env, mlhpc

REPO = Path(__file__).resolve().parents[2]
TOOLS = JobTools(run_and_time=REPO / "run_and_time.sh", mlhpc_cmd=(sys.executable, "-m", "mlhpc"))
RESOURCES = SlurmResources(nodes=2, ntasks_per_node=2, partition="gpu", sbatch_args=("--account=abc",))


def options(tmp_path: Path, **changes: object) -> RunOptions:
    """A 3-seed campaign from seed 100 into tmp_path/out, as absolute as the submitter makes them."""
    values: dict[str, object] = {
        "benchmark": "cosmoflow",
        "overrides": ("loop.max_epochs=20",),
        "num_seeds": 3,
        "first_seed": 100,
        "out": tmp_path / "out",
        "submitter": "org",
        "system": "sys_n4",
        "resume": True,
    }
    values.update(changes)
    return absolute(RunOptions(**values))  # type: ignore[arg-type]


def planned(opts: RunOptions) -> CampaignPlan:
    """The planner's campaign for `opts`, as `mlhpc run --slurm` plans it on a login node."""
    return plan_out(slurm_request(prepare(opts)))


def graph(
    tmp_path: Path, *, generate: bool = True, resources: SlurmResources = RESOURCES, **changes: object
) -> tuple[SlurmGraph, RunOptions, CampaignPlan]:
    opts = options(tmp_path, **changes)
    plan = planned(opts)
    return build_graph(opts, plan, resources, TOOLS, generate=generate), opts, plan


def job(g: SlurmGraph, name: str) -> SlurmJob:
    return next(j for j in g.jobs if j.name == name)


def sbatch_directives(text: str) -> list[str]:
    """The #SBATCH options sbatch reads: those before the first command."""
    found = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH "):
            found.append(line.removeprefix("#SBATCH "))
        elif line and not line.startswith("#"):
            break
    return found


def test_the_graph_holds_the_plan(tmp_path: Path) -> None:
    g, _, plan = graph(tmp_path)
    assert plan.seeds == (100, 101, 102) and plan.to_run == (0, 1, 2)
    assert [j.name for j in g.jobs] == ["generate", "seed_0", "seed_1", "seed_2", "check"]
    assert [(j.index, j.seed) for j in g.seed_jobs] == [(0, 100), (1, 101), (2, 102)]
    assert all(j.after == ("generate",) and j.dependency == "afterok" for j in g.seed_jobs)
    check = job(g, "check")
    assert check.after == ("seed_0", "seed_1", "seed_2") and check.dependency == "afterany"
    assert g.folder == tmp_path / "out" / "slurm"


def test_seed_script_asks_for_the_allocation(tmp_path: Path) -> None:
    g, _, _ = graph(tmp_path)
    seed = job(g, "seed_1")
    assert (
        sbatch_directives(seed.script)
        == list(seed.resources)
        == [
            "--job-name=mlhpc-cosmoflow-1",
            "--nodes=2",
            "--ntasks-per-node=2",
            "--time=01:00:00",
            "--partition=gpu",
            f"--output={g.folder}/seed_1-%j.out",
            "--account=abc",
        ]
    )
    assert seed.script.startswith("#!/bin/bash\n")
    proc = subprocess.run(["bash", "-n"], input=seed.script, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_seed_script_runs_run_and_time_for_its_seed(tmp_path: Path) -> None:
    """Run the script itself with DRY_RUN=1: run_and_time.sh prints the command the job would run."""
    g, opts, plan = graph(tmp_path)
    script = tmp_path / "seed_2.sbatch"
    script.write_text(job(g, "seed_2").script)
    env = cli_env(DRY_RUN="1", SLURM_TMPDIR=str(tmp_path / "node-local"))
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[:5] == ["srun", "--kill-on-bad-exit=1", sys.executable, "-m", "mlhpc"]
    # Index 2 of the campaign whose seeds start at 100, straight into the submission, unchecked.
    ran = from_args(build_parser("run").parse_args(words[5:]))
    assert ran == replace(opts, data=plan.data, index=2, check=False)
    assert words[5:] == seed_argv(opts, plan, 2)
    assert (ran.first_seed, ran.out, ran.resume) == (100, opts.out, True)
    assert ran.overrides == ("loop.max_epochs=20",)
    assert "export SEED=102" in job(g, "seed_2").script  # the planner's seed, for the RESULT line


def test_check_script_checks_the_submitters_folder(tmp_path: Path) -> None:
    g, opts, _ = graph(tmp_path)
    text = job(g, "check").script
    assert "--ntasks=1" in sbatch_directives(text)
    command = text.strip().splitlines()[-1]
    assert shlex.split(command)[:7] == [
        sys.executable,
        "-m",
        "mlhpc",
        "check",
        str(opts.out / "org"),
        "--ruleset",
        "3.0.0",
    ]
    assert f"--json {g.folder}/check-" in command
    assert "--short-campaign" in shlex.split(command)  # a 2-seed try's check job is not a failed job


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
    g, _, _ = graph(
        tmp_path, resources=SlurmResources(sbatch_args=(*GPU_REQUESTS, *kept, "--gres=gpu:4,nvme:2"))
    )
    for j in g.jobs:
        found = sbatch_directives(j.script)
        if j.index is not None:
            assert all(arg in found for arg in GPU_REQUESTS)
            continue
        assert all(arg in found for arg in kept), (j.name, found)
        assert "--gres=nvme:2" in found, found  # the GPU entry of a list goes, the rest stays
        gpu = [arg for arg in found if "gpu" in arg.lower() and arg != "--constraint=gpu_node"]
        assert not gpu, (j.name, gpu)


def test_a_resumed_graph_runs_only_the_missing_seeds(tmp_path: Path) -> None:
    opts = options(tmp_path)
    resumed = replace(planned(opts), to_run=(1,))
    g = build_graph(opts, resumed, RESOURCES, TOOLS, generate=False)
    assert [j.name for j in g.jobs] == ["seed_1", "check"]
    assert job(g, "seed_1").after == () and job(g, "check").after == ("seed_1",)
    assert f"sbatch --parsable --dependency=afterany:<seed_1> {g.folder}/check.sbatch" in g.dry_run_text()
    assert f"sbatch --parsable {g.folder}/seed_1.sbatch" in g.dry_run_text()


def recording_sbatch(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in sbatch on PATH (a real program, run as a subprocess) that records each call's
    argv, one line, and a copy of the script it was given, and answers with the next job id and
    a cluster name, as --parsable does. Returns (its folder, the calls file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/bash\n"
        f'printf "%q " "$@" >> {calls}; echo >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f'cat "${{@: -1}}" > {tmp_path}/script_$n.txt\n'
        'echo "$((n + 40));mycluster"\n'
    )
    fake.chmod(0o755)
    return bin_dir, calls


def test_the_dry_run_prints_exactly_what_submit_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One graph: its dry-run text, with each `<job>` replaced by the id sbatch gave that job, is
    the sbatch commands the submitter ran, one per job, in order, with the same scripts."""
    g, _, _ = graph(tmp_path)
    text = g.dry_run_text()
    bin_dir, calls = recording_sbatch(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    ids = submit(g)
    assert ids == {"generate": "41", "seed_0": "42", "seed_1": "43", "seed_2": "44", "check": "45"}
    ran = [shlex.split(line) for line in calls.read_text().splitlines()]
    printed = text.split("### would submit\n", 1)[1].splitlines()
    assert len(ran) == len(printed) == len(g.jobs)
    for n, (j, argv, line) in enumerate(zip(g.jobs, ran, printed, strict=True), start=1):
        for name, job_id in ids.items():
            line = line.replace(f"<{name}>", job_id)
        assert ["sbatch", *argv] == shlex.split(line) == g.sbatch_argv(j, ids)
        script = (tmp_path / f"script_{n}.txt").read_text()
        assert script == j.script and f"### {g.script_path(j)}\n{script}" in text
    assert ran[1][:3] == ["--parsable", "--dependency=afterok:41", "--kill-on-invalid-dep=yes"]
    assert ran[-1][:2] == ["--parsable", "--dependency=afterany:42:43:44"]
    recorded = json.loads((g.folder / "jobs.json").read_text())
    assert recorded == {
        "generate": "41",
        "seeds": {
            "0": {"job": "42", "seed": 100},
            "1": {"job": "43", "seed": 101},
            "2": {"job": "44", "seed": 102},
        },
        "check": "45",
    }


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
    p = plan_out(slurm_request(prepare(from_args(slurm_args(out, *extra, *(["--resume"] if resume else []))))))
    return list(p.seeds), list(p.to_run)


def test_random_first_seeds_differ_and_count_up(tmp_path: Path) -> None:
    picks = [plan_seeds(tmp_path, 3, None, resume=False) for _ in range(5)]
    for seeds, to_run in picks:
        assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2] and seeds[0] >= 1
        assert to_run == [0, 1, 2]
    assert len({seeds[0] for seeds, _ in picks}) > 1


def test_local_and_slurm_plan_the_same_campaign(tmp_path: Path) -> None:
    """The runner's and the submitter's requests for one command line give one plan."""
    common = ["--seeds", "3", "--first-seed", "40", "--system", "sys", "--resume"]
    write_result(tmp_path, 1, 41)  # a resumed campaign: the same kept run on both routes
    args = build_parser("run").parse_args(
        ["run", "cosmoflow", "loop.max_epochs=20", "--out", str(tmp_path), "--submitter", "org", *common]
    )
    opts = from_args(args)
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    local = plan_out(campaign_request(opts, resolved, "strong", default_system="this_machine_n1"))
    slurm = plan_out(slurm_request(prepare(from_args(slurm_args(tmp_path, "--submitter", "org", *common)))))
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


def test_submit_reports_an_sbatch_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/bash\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(SubmissionError, match="invalid partition specified"):
        submit(graph(tmp_path)[0])


def test_cli_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    args = ["run", "cosmoflow", "--slurm", "--dry-run", "--seeds", "2", "--first-seed", "9", "--out", "runs"]
    proc = mlhpc(*args, "--slurm-nodes", "2", "--sbatch-arg=--account=abc", "loop.max_epochs=20", cwd=tmp_path)
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
    proc = mlhpc("run", "cosmoflow", "--out", "runs", *extra, cwd=tmp_path)
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
    proc = mlhpc("run", *extra, "--slurm", "--out", "runs", cwd=tmp_path, **env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not calls.exists() and not (tmp_path / "runs" / "slurm").exists()


def test_slurm_submission_records_the_campaign_and_refuses_a_second_or_a_changed_one(tmp_path: Path) -> None:
    env, calls = fake_sbatch(tmp_path)
    first = mlhpc(
        "run", "cosmoflow", "--slurm", "--seeds", "2", "--out", "runs", "--system", "s", cwd=tmp_path, **env
    )
    assert first.returncode == 0, first.stderr
    recorded = read_campaign_file(tmp_path / "runs" / CAMPAIGN_FILE)
    assert recorded is not None and recorded.settings.system == "s"
    assert recorded.entries["cosmoflow/strong"].num_runs == 2
    submitted = calls.read_text().count("\n")
    assert submitted == 4  # data, two seeds, check

    again = mlhpc("run", "cosmoflow", "--slurm", "--seeds", "2", "--out", "runs", cwd=tmp_path, **env)
    assert again.returncode == 2 and "pass --resume" in again.stderr, again.stderr
    changed = mlhpc(
        "run", "cosmoflow", "--slurm", "--resume", "--out", "runs", "loop.max_epochs=3", cwd=tmp_path, **env
    )
    assert changed.returncode == 2 and "pass the same --config and overrides" in changed.stderr, (
        changed.stderr
    )
    other = mlhpc(
        "run", "cosmoflow", "--slurm", "--resume", "--out", "runs", "--system", "t", cwd=tmp_path, **env
    )
    assert other.returncode == 2 and "one --out holds one system" in other.stderr, other.stderr
    assert calls.read_text().count("\n") == submitted  # none of them reached sbatch

    resumed = mlhpc(
        "run", "cosmoflow", "--slurm", "--resume", "--seeds", "2", "--out", "runs", cwd=tmp_path, **env
    )
    assert resumed.returncode == 0, resumed.stderr
    first_seed = recorded.entries["cosmoflow/strong"].first_seed
    assert f"seed {first_seed + 1} -> result_1.txt" in resumed.stdout  # the same campaign's seeds


def test_a_second_submission_into_a_busy_out_is_refused(tmp_path: Path) -> None:
    from tests.helpers.processes import lock_held_elsewhere

    env, calls = fake_sbatch(tmp_path)
    out = tmp_path / "runs"
    with lock_held_elsewhere(out):
        proc = mlhpc("run", "cosmoflow", "--slurm", "--out", str(out), cwd=tmp_path, **env)
    assert proc.returncode == 2 and "in use by" in proc.stderr, proc.stderr
    assert not calls.exists()
