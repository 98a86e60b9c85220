"""Every launcher for real: srun and sbatch on a single-node Slurm started by a fixture, srun with
PMIx and mpi4py, mpirun (Open MPI) and a two-"node" torchrun rendezvous (horovodrun and Horovod
under mpirun: tests/cluster/test_horovod_real.py). A missing launcher skips its tests with the reason;
nothing is mocked."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.benchmarks.cosmoflow import data as cosmo_data_module
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.cli import cli_env

# slurm_cluster_fixture provides the `slurm_cluster` fixture.
from tests.helpers.cluster_fixtures import SlurmCluster, free_port, slurm_cluster_fixture  # noqa: F401
from tests.helpers.datasets import dataset_files
from tests.helpers.mllog_files import mllog_events

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]
# A launch test needs the ranks to train and evaluate together, not a converged model: with a
# target any first evaluation meets, one short epoch ends the run with status success.
QUICK = ["data.num_train_samples=256", "data.num_eval_samples=32", "loop.max_epochs=2", "loop.target=2.0"]
# The campaign is checked, so it keeps the real target: 2 ranks reach MAE 0.124 in about 4
# epochs of about 1.2 s with these (seeds 41 and 42 do; some seeds need more than 12 epochs).
CAMPAIGN = ["data.num_train_samples=1024", "data.num_eval_samples=64", "loop.max_epochs=20"]
LAUNCH_TIMEOUT_S = 240
# Each rank writes its own file in the working directory: ranks' stdout lines can interleave.
DETECT = (
    "import json; from mlhpc.common.cluster.launch import detect_launch; i = detect_launch(); "
    "open(f'detect_{i.rank}.json', 'w').write(json.dumps(dict(launcher=i.launcher, rank=i.rank, "
    "world=i.world_size, local_rank=i.local_rank, local_world=i.local_world_size, master=i.master_addr)))"
)
OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

# One worker runs the module: its Slurm fixture reuses a munged another worker started, and that
# worker's teardown would stop it mid-test (seen under load: "Munge encode failed").
pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("host-slurm")]


def run(
    command: list[str], env: dict[str, str], cwd: Path, timeout: float = LAUNCH_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def detected(folder: Path) -> list[dict]:
    """The detect_launch() of every rank that ran DETECT in `folder`, in rank order."""
    found = [json.loads(path.read_text()) for path in folder.glob("detect_*.json")]
    return sorted(found, key=lambda d: d["rank"])


def result_logs(out: Path) -> list[Path]:
    return sorted(out.glob("mlhpc/results/*/strong/cosmoflow/result_*.txt"))


def assert_trained(log: Path, seed: int, ranks: int = 2) -> None:
    """A complete run of `seed` on `ranks` ranks (its system is <host>_<kind>_n<ranks>) that reached the target."""
    events = mllog_events(log)
    keys = [e["key"] for e in events]
    for key in (
        "init_start",
        "staging_start",
        "staging_stop",
        "run_start",
        "epoch_start",
        "eval_error",
        "run_stop",
    ):
        assert key in keys, f"{log}: no {key}"
    stop = next(e for e in events if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success", stop
    assert next(e["value"] for e in events if e["key"] == "seed") == seed
    assert log.parents[2].name.endswith(f"_n{ranks}"), log


def sw_notes(out: Path) -> str:
    (system,) = list(out.glob("mlhpc/systems/*.json"))
    return json.loads(system.read_text())["sw_notes"]


def check_errors(org: Path, tmp: Path) -> tuple[list[dict], list[dict]]:
    """(runs, error findings) of `mlhpc check` on a submission."""
    report = tmp / f"check-{org.parent.name}.json"
    proc = run([PYTHON, "-m", "mlhpc", "check", str(org), "--json", str(report)], cli_env(), tmp, timeout=180)
    assert proc.returncode in (0, 1), output(proc)
    data = json.loads(report.read_text())
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    runs = []
    for entry in data["entries"]:
        errors += [f for f in entry["findings"] if f["severity"] == "error"]
        runs += entry["runs"]
    return runs, errors


def assert_checks_but_for_run_count(org: Path, tmp: Path, runs: int) -> None:
    """Compliant logs; the only error is that fewer runs than the 10 a CosmoFlow score needs were made."""
    found, errors = check_errors(org, tmp)
    assert len(found) == runs and all(r["compliant"] for r in found), found
    assert [f["rule"] for f in errors] == ["run-count"], errors
    assert f"{runs} result_*.txt file(s)" in errors[0]["message"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset QUICK asks for, generated once: every launch stages it instead of generating its own."""
    from mlhpc.staging import build_manifest
    from mlhpc.staging.manifest import MANIFEST_NAME

    cfg = load_config(CosmoFlowConfig, registry.get("cosmoflow").config_path("mini"), QUICK)
    root = tmp_path_factory.mktemp("launch-data") / "cosmoflow"
    cosmo_data_module.generate(cfg, root, seed=3)
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def run_args(out: Path, data: Path, seed: int) -> list[str]:
    """`mlhpc run` arguments for one tiny seed; the check comes after, in the test."""
    command = ["run", "cosmoflow", "--config", "mini", "--seeds", "1", "--first-seed", str(seed)]
    return [*command, "--out", str(out), "--data", str(data), "--no-check", *QUICK]


def need(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not found (apt-get install openmpi-bin slurm-wlm, as .ci/run does)"
        )


def need_mpi4py() -> None:
    proc = subprocess.run([PYTHON, "-c", "import mpi4py.MPI"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"mpi4py does not import: {proc.stderr.strip().splitlines()[-1:]} (pip install '.[mpi]')")


# ---------------------------------------------------------------------------------------------
# srun and sbatch on a real single-node Slurm


def test_srun_sets_what_detect_launch_reads(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = run(["srun", "-N1", "-n2", PYTHON, "-c", DETECT], slurm_cluster.env(), tmp_path, timeout=60)
    assert proc.returncode == 0, output(proc)
    ranks = detected(tmp_path)
    assert [(r["launcher"], r["rank"], r["world"], r["local_rank"], r["local_world"]) for r in ranks] == [
        ("slurm", 0, 2, 0, 2),
        ("slurm", 1, 2, 1, 2),
    ]
    assert {r["master"] for r in ranks} == {slurm_cluster.node}


@pytest.mark.slow
def test_srun_trains_two_ranks(slurm_cluster: SlurmCluster, tiny_data: Path, tmp_path: Path) -> None:
    """Two ranks of one srun step find each other from SLURM_* alone (the checked campaign below
    runs the same step with the real target)."""
    out = tmp_path / "out"
    env = slurm_cluster.env(OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    command = [
        "srun",
        "-N1",
        "-n2",
        "--kill-on-bad-exit=1",
        PYTHON,
        "-m",
        "mlhpc",
        *run_args(out, tiny_data, 11),
    ]
    proc = run(command, env, tmp_path)
    assert proc.returncode == 0, output(proc)
    (log,) = result_logs(out)
    assert_trained(log, 11)
    assert sw_notes(out) == "mlhpc; launcher slurm; backend gloo"


def test_srun_pmix_runs_mpi4py_and_mpi_staging(
    slurm_cluster: SlurmCluster, tiny_data: Path, tmp_path: Path
) -> None:
    plugins = run(["srun", "--mpi=list"], slurm_cluster.env(), tmp_path, timeout=30)
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip("this Slurm has no PMIx plugin (srun --mpi=list)")
    need_mpi4py()
    env = slurm_cluster.env()
    allreduce = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1))"
    proc = run(["srun", "-n2", "--mpi=pmix", PYTHON, "-c", allreduce], env, tmp_path, timeout=60)
    assert proc.returncode == 0, output(proc)
    assert sorted(proc.stdout.split("\n")[:2]) == ["0 2 3", "1 2 3"]
    # Staging's MPI communicator under srun: each rank plays a node and gets its shard.
    dest = tmp_path / "staged" / "node{node}"
    stage = [
        "mlhpc",
        "stage",
        str(tiny_data),
        str(dest),
        "--comm",
        "mpi",
        "--each-rank-a-node",
        "--mode",
        "shard",
    ]
    proc = run(["srun", "-n2", "--mpi=pmix", PYTHON, "-m", *stage], env, tmp_path, timeout=120)
    assert proc.returncode == 0, output(proc)
    assert "2 node(s)" in proc.stdout, output(proc)
    shards = [set(dataset_files(tmp_path / "staged" / f"node{i}")) for i in (0, 1)]
    assert shards[0] and shards[1] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(dataset_files(tiny_data))


@pytest.mark.slow
def test_slurm_campaign_runs_to_a_checked_submission(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """`mlhpc run --slurm`: a data job, one job per seed through run_and_time.sh, a check job. One
    task per seed job, so that both seeds run at once and file their results into one OUT together."""
    out = tmp_path / "campaign"
    env = slurm_cluster.env(OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    command = [PYTHON, "-m", "mlhpc", "run", "cosmoflow", "--slurm", "--seeds", "2", "--first-seed", "41"]
    command += ["--out", str(out), "--slurm-ntasks-per-node", "1", "--slurm-time", "00:10:00", *CAMPAIGN]
    dry = run([*command, "--dry-run"], env, tmp_path, timeout=60)
    assert dry.returncode == 0 and not out.exists(), output(dry)
    proc = run(command, env, tmp_path, timeout=60)
    assert proc.returncode == 0, output(proc)
    jobs = json.loads((out / "slurm" / "jobs.json").read_text())
    assert {i: s["seed"] for i, s in jobs["seeds"].items()} == {"0": 41, "1": 42}
    assert f"check job {jobs['check']}" in proc.stdout
    # The dry run printed the graph that was submitted: the same scripts, one per job.
    scripts = sorted((out / "slurm").glob("*.sbatch"))
    assert [p.stem for p in scripts] == ["check", "generate", "seed_0", "seed_1"]
    assert all(f"### {p}\n{p.read_text()}" in dry.stdout for p in scripts), dry.stdout
    # sbatch --wait on a job that starts only once the check job has ended.
    waited = run(
        [
            "sbatch",
            "--wait",
            f"--dependency=afterany:{jobs['check']}",
            f"--output={tmp_path}/wait.out",
            "--wrap=true",
        ],
        env,
        tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )
    job_outputs = "\n".join(
        f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((out / "slurm").glob("*.out"))
    )
    assert waited.returncode == 0, output(waited) + job_outputs
    logs = result_logs(out)
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"], job_outputs
    assert_trained(logs[0], 41, ranks=1)
    assert_trained(logs[1], 42, ranks=1)
    # No --system: the first seed job named it from the hardware (not a host name), and the
    # other job, on the same machine type, filed under the same one.
    from mlhpc.system_desc import cpu_model, hardware_slug

    system = hardware_slug(cpu_model(), "cpu", 1)
    assert {p.parent.parent.parent.name for p in logs} == {system}
    assert json.loads((out / "campaign.json").read_text())["settings"]["system"] == system
    assert sw_notes(out) == "mlhpc; launcher slurm; backend none"  # one rank: no process group
    (checked,) = list((out / "slurm").glob("check-*.json"))
    check_job = json.loads(checked.read_text())
    assert [f["rule"] for e in check_job["entries"] for f in e["findings"] if f["severity"] == "error"] == [
        "run-count"
    ]
    assert_checks_but_for_run_count(out / "mlhpc", tmp_path, runs=2)


@pytest.mark.slow
def test_sbatch_template_trains(slurm_cluster: SlurmCluster, tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = slurm_cluster.env(OUT=str(out), DATA=str(tiny_data), SEEDS="1", FIRST_SEED="5", OMP_NUM_THREADS="1")
    sbatch = REPO / "scripts" / "slurm" / "train.sbatch"
    command = ["sbatch", "--wait", f"--output={tmp_path}/job.out", f"--chdir={tmp_path}", str(sbatch), *QUICK]
    proc = run(command, env, tmp_path)
    job_out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, output(proc) + job_out[-3000:]
    (log,) = result_logs(out)
    assert_trained(log, 5)
    assert sw_notes(out) == "mlhpc; launcher slurm; backend gloo"


# ---------------------------------------------------------------------------------------------
# mpirun (Open MPI)


def mpirun(*args: str) -> list[str]:
    # -x passes the variables on to the ranks (Open MPI forwards only what it is told to).
    forward = [x for name in ("PATH", "OMP_NUM_THREADS", "MLHPC_LOCAL_DIR") for x in ("-x", name)]
    return ["mpirun", "-np", "2", "--oversubscribe", *forward, *args]


def test_mpirun_sets_what_detect_launch_reads(tmp_path: Path) -> None:
    need("mpirun")
    proc = run(mpirun(PYTHON, "-c", DETECT), cli_env(**OMPI_ROOT), tmp_path, timeout=60)
    assert proc.returncode == 0, output(proc)
    ranks = detected(tmp_path)
    assert [(r["launcher"], r["rank"], r["world"], r["local_rank"], r["local_world"]) for r in ranks] == [
        ("mpi", 0, 2, 0, 2),
        ("mpi", 1, 2, 1, 2),
    ]


def test_mpirun_stages_over_mpi(tmp_path: Path) -> None:
    """Under mpirun with mpi4py, `mlhpc run` joins the gloo group and stages through MpiComm."""
    need("mpirun")
    need_mpi4py()
    # One report file per rank: two ranks' stdout lines can interleave mid-line under mpirun.
    probe = (
        "from pathlib import Path; "
        "from mlhpc.common.cluster.distributed import init_distributed; "
        "from mlhpc.common.cluster.group import shutdown_distributed; "
        "from mlhpc.staging import comm_for; ctx = init_distributed('auto', 'cpu'); "
        "comm = comm_for(ctx); Path(f'rank{ctx.rank}.txt').write_text(' '.join(map(str, "
        "(ctx.rank, ctx.launcher, ctx.backend, type(comm).__name__, comm.topology.num_nodes)))); "
        "shutdown_distributed()"
    )
    env = cli_env(**OMPI_ROOT, MASTER_PORT=str(free_port()))
    proc = run(mpirun("-x", "MASTER_PORT", PYTHON, "-c", probe), env, tmp_path, timeout=120)
    assert proc.returncode == 0, output(proc)
    lines = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert lines == ["0 mpi gloo MpiComm 1", "1 mpi gloo MpiComm 1"]


@pytest.mark.slow
def test_mpirun_trains_two_ranks(tiny_data: Path, tmp_path: Path) -> None:
    need("mpirun")
    out = tmp_path / "out"
    env = cli_env(
        **OMPI_ROOT,
        OMP_NUM_THREADS="1",
        MLHPC_LOCAL_DIR=str(tmp_path / "local"),
        MASTER_PORT=str(free_port()),
    )
    proc = run(
        mpirun("-x", "MASTER_PORT", PYTHON, "-m", "mlhpc", *run_args(out, tiny_data, 21)), env, tmp_path
    )
    assert proc.returncode == 0, output(proc)
    (log,) = result_logs(out)
    assert_trained(log, 21)
    assert sw_notes(out) == "mlhpc; launcher mpi; backend gloo"


# ---------------------------------------------------------------------------------------------
# torchrun: a two-node rendezvous, both "nodes" on this host


def test_torchrun_sets_what_detect_launch_reads(tmp_path: Path) -> None:
    script = tmp_path / "detect.py"  # torchrun runs a script or a module, not -c
    script.write_text(DETECT + "\n")
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = run(command, cli_env(), tmp_path, timeout=120)
    assert proc.returncode == 0, output(proc)
    ranks = detected(tmp_path)
    assert [(r["launcher"], r["rank"], r["world"], r["local_rank"], r["local_world"]) for r in ranks] == [
        ("torchrun", 0, 2, 0, 2),
        ("torchrun", 1, 2, 1, 2),
    ]


@pytest.mark.slow
def test_torchrun_two_node_rendezvous_trains(tiny_data: Path, tmp_path: Path) -> None:
    """Two torchrun agents, one per "node", meet at a c10d rendezvous and train one model."""
    out = tmp_path / "out"
    port = free_port()
    # Both agents are on this host, so they share its node-local disk, as ranks of one node would.
    env = cli_env(OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    agents = []
    for node_rank in (0, 1):
        command = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node_rank}"]
        command += ["--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
        command += [f"--rdzv-id=mlhpc-test-{port}", "-m", "mlhpc", *run_args(out, tiny_data, 31)]
        log = open(tmp_path / f"agent{node_rank}.log", "w")  # noqa: SIM115 - closed below
        agents.append(
            (subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT), log)
        )
    codes = []
    for agent, log in agents:
        try:
            codes.append(agent.wait(timeout=LAUNCH_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            agent.kill()
            codes.append(agent.wait())
        log.close()
    logs = "\n".join((tmp_path / f"agent{i}.log").read_text()[-3000:] for i in (0, 1))
    assert codes == [0, 0], logs
    (result,) = result_logs(out)
    assert_trained(result, 31)
    assert sw_notes(out) == "mlhpc; launcher torchrun; backend gloo"
