"""Training across the hosts of the session's virtual cluster (scripts/vcluster): a `--slurm`
campaign whose seed jobs each train with DDP on two nodes, weak scaling spread over the four
nodes and scored, and the other launchers across two hosts: torchrun with a c10d rendezvous,
mpirun inside a Slurm allocation, Horovod under srun.

How a test knows the ranks sat on different hosts, not on one:
- the MLLOG `number_of_nodes` and `systems/<system>.json`'s come from the ranks' host names
  (gathered at init, `common/cluster/launch.node_layout`; under Horovod, from MPI's ranks per host):
  two ranks on one host log 1;
- each node's switch port counts the bytes the node sent (`ip -s link` in the switch's
  namespace): at least one model's worth of gradients a training step (DDP all-reduces every
  step), more than the staged dataset, and none of it would cross a link were the ranks on
  one host (loopback).

Every client (sbatch, srun, salloc, torchrun, mpirun) runs on `login` or a node, never in the
host's own network namespace (docs/MULTINODE.md). Data and results live in the cluster's shared
folder; runs stage to each node's own /local (the campaign: to each node's own /tmp, its default).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.cluster_runs import QUICK, TO_TARGET, assert_success, dataset, value
from tests.helpers.horovod_build import wait_for_horovod_build
from tests.helpers.mllog_files import mllog_events
from tests.helpers.vcluster_fixture import VCluster

pytestmark = pytest.mark.cluster

TWO_HOSTS = ("node01", "node02")
RUN_TIMEOUT_S = 300
WEAK_TIMEOUT_S = 540  # ten models to target on 2 shared cores: 2-3.5 min measured
OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def quick_data(vcluster: VCluster) -> Iterator[Path]:
    folder = vcluster.shared / f"train-quick-{uuid.uuid4().hex[:8]}"
    yield dataset(folder / "cosmoflow", QUICK)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def target_data(vcluster: VCluster) -> Iterator[Path]:
    folder = vcluster.shared / f"train-target-{uuid.uuid4().hex[:8]}"
    yield dataset(folder / "cosmoflow", TO_TARGET)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def param_bytes() -> int:
    """The bytes of the mini model's parameters: what DDP all-reduces every step."""
    bench = registry.get("cosmoflow")
    cfg = load_config(bench.config_class, bench.config_path("mini"), [])
    return sum(p.numel() * p.element_size() for p in bench.build_model(cfg).parameters())


@pytest.fixture
def work(vcluster: VCluster) -> Iterator[Path]:
    """A fresh folder every host sees (each node's /tmp is its own), removed after the test."""
    folder = vcluster.shared / f"work-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def local(vcluster: VCluster) -> Iterator[str]:
    """A fresh /local/<name> (each node's own disk) for the test's runs, removed after it."""
    name = f"train-{uuid.uuid4().hex[:8]}"
    yield f"/local/{name}"
    for node in vcluster.nodes:
        shutil.rmtree(vcluster.local_dir(node) / name, ignore_errors=True)


def sent_bytes(vcluster: VCluster) -> dict[str, int]:
    """Bytes each node has sent into the switch (its switch port's received bytes)."""
    links = json.loads(vcluster.exec("switch", ["ip", "-s", "-j", "link"]).stdout)
    return {
        link["ifname"]: link["stats64"]["rx"]["bytes"] for link in links if link["ifname"] in vcluster.nodes
    }


def training_steps(events: list[dict]) -> int:
    """Optimizer steps a run took: its epochs times the steps of one epoch."""
    stop = next(e for e in events if e["key"] == "run_stop")
    per_epoch = -(-int(value(events, "train_samples")) // int(value(events, "global_batch_size")))
    return int(stop["metadata"]["epoch_num"]) * per_epoch


def system_json(out: Path) -> dict:
    (path,) = list((out / "mlhpc" / "systems").glob("*.json"))
    return json.loads(path.read_text())


def check_report(vcluster: VCluster, org: Path, report: Path) -> dict:
    """`mlhpc check ORG --json REPORT` (exit 0 passed, 1 findings), run on the login host."""
    proc = vcluster.exec(
        "login", ["mlhpc", "check", str(org), "--json", str(report)], check=False, timeout=180
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(report.read_text())


def errors(report: dict) -> list[str]:
    found = [f["rule"] for f in report["findings"] if f["severity"] == "error"]
    return found + [f["rule"] for e in report["entries"] for f in e["findings"] if f["severity"] == "error"]


def run_argv(out: Path, data: Path, local: str, seed: int) -> list[str]:
    """One quick seed of `mlhpc run` (no check: the test looks at what it wants)."""
    command = ["mlhpc", "run", "cosmoflow", "--config", "mini", "--seeds", "1", "--first-seed", str(seed)]
    return [*command, "--out", str(out), "--data", str(data), "--local-dir", local, "--no-check", *QUICK]


def assert_trained_across(
    out: Path, seed: int, nodes: tuple[str, ...], sent: dict[str, int], param_bytes: int, sw_notes: str
) -> None:
    """One quick run of `seed` filed under a system of len(nodes) nodes, whose every node sent at
    least a model's gradients a training step over its link."""
    (log,) = list((out / "mlhpc" / "results").glob("*/strong/cosmoflow/result_0.txt"))
    events = assert_success(log, seed, nodes=len(nodes))
    system = system_json(out)
    assert (system["number_of_nodes"], system["sw_notes"]) == (str(len(nodes)), sw_notes)
    need = training_steps(events) * param_bytes
    assert all(sent[node] >= need for node in nodes), (sent, need)


# ---------------------------------------------------------------------------------------------
# A strong-scaling campaign through real sbatch, two nodes a seed


@pytest.mark.parametrize(
    "nodelist", ["node[01-02]", "n[003-005,9],gpu1", "login1", "rack[1-2]-node[01-04],x", "c[10-11]-g[2,4]"]
)
def test_the_rendezvous_host_is_the_first_scontrol_names(vcluster: VCluster, nodelist: str) -> None:
    """An srun step's rank 0 sits on its node list's first host, where the others look for it."""
    from mlhpc.common.cluster.launch import first_slurm_host

    expanded = vcluster.exec("login", ["scontrol", "show", "hostnames", nodelist]).stdout.split()
    assert first_slurm_host(nodelist) == expanded[0]


def job_nodes(vcluster: VCluster, job: str) -> list[str]:
    """The hosts Slurm gave `job` (ended jobs stay known to slurmctld for MinJobAge, 300 s)."""
    shown = vcluster.exec("login", ["scontrol", "-o", "show", "job", job]).stdout
    nodelist = re.search(r"\bNodeList=(\S+)", shown)
    assert nodelist is not None, shown
    return vcluster.exec("login", ["scontrol", "show", "hostnames", nodelist.group(1)]).stdout.split()


@pytest.mark.slow
def test_slurm_campaign_trains_each_seed_with_ddp_across_two_hosts(
    vcluster: VCluster, target_data: Path, param_bytes: int, work: Path
) -> None:
    """`mlhpc run --slurm --slurm-nodes 2` from the login host: each seed job trains one model on
    two nodes to the real target; both results land under one system of 2 nodes, and the check
    job finds nothing wrong but the run count (2 of the 10 a CosmoFlow score needs)."""
    out = work / "campaign"
    command = ["mlhpc", "run", "cosmoflow", "--config", "mini", "--seeds", "2", "--first-seed", "41"]
    command += ["--slurm", "--slurm-nodes", "2", "--slurm-time", "00:10:00", "--out", str(out)]
    command += ["--data", str(target_data), *TO_TARGET]  # staged to each node's /tmp, the default
    before = sent_bytes(vcluster)
    submitted = vcluster.exec("login", command, cwd=work, timeout=120)
    jobs = json.loads((out / "slurm" / "jobs.json").read_text())
    assert f"check job {jobs['check']}" in submitted.stdout
    # sbatch --wait on a job that can start only once the check job has ended
    waited = vcluster.exec(
        "login",
        [
            "sbatch",
            "--wait",
            f"--dependency=afterany:{jobs['check']}",
            f"--output={work}/wait.out",
            "--wrap=true",
        ],
        check=False,
        timeout=RUN_TIMEOUT_S,
    )
    sent = {node: n - before[node] for node, n in sent_bytes(vcluster).items()}
    outputs = "\n".join(
        f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((out / "slurm").glob("*.out"))
    )
    states = vcluster.exec("login", ["scontrol", "-o", "show", "job"], check=False).stdout
    assert waited.returncode == 0, f"{waited.stderr}{outputs}\n--- scontrol show job\n{states}"

    logs = sorted((out / "mlhpc" / "results").glob("*/strong/cosmoflow/result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"], outputs
    (system,) = {p.parents[2].name for p in logs}  # one system for both seeds
    assert system.endswith("_n2"), system  # 2 ranks, one a node
    described = system_json(out)
    assert (described["system_name"], described["number_of_nodes"]) == (system, "2")
    assert described["sw_notes"] == "mlhpc; launcher slurm; backend gloo"

    need = dict.fromkeys(vcluster.nodes, 0)
    for index, seed in ((0, 41), (1, 42)):
        events = assert_success(logs[index], seed, nodes=2)  # two host names among the ranks
        hosts = job_nodes(vcluster, jobs["seeds"][str(index)]["job"])
        assert len(hosts) == 2, hosts
        for host in hosts:  # the two seed jobs may share nodes: their gradients add up there
            need[host] += training_steps(events) * param_bytes
    assert all(sent[node] >= need[node] for node in vcluster.nodes), (sent, need)

    (checked,) = list((out / "slurm").glob("check-*.json"))
    report = json.loads(checked.read_text())
    runs = [r for e in report["entries"] for r in e["runs"]]
    assert len(runs) == 2 and all(r["compliant"] for r in runs), runs
    assert errors(report) == ["run-count"]
    # ... which is a short campaign, not a failed job: the check job ends 0 and says so (issue 40)
    said = (out / "slurm" / f"check-{jobs['check']}.out").read_text()
    assert re.search(r"2 of \d+ runs: not yet a scoreable entry", said), said[-2000:]
    shown = vcluster.exec("login", ["scontrol", "-o", "show", "job", str(jobs["check"])]).stdout
    assert " ExitCode=0:0 " in f" {shown} ", shown


@pytest.mark.slow
def test_a_two_seed_campaign_under_srun_ends_0_on_every_rank(
    vcluster: VCluster, target_data: Path, local: str, work: Path
) -> None:
    """`srun -N 2 mlhpc run --seeds 2` with its own check: 2 runs are not a score, yet a finished
    campaign; every rank exits 0 (srun's own status) and rank 0 says what it is (issue 40)."""
    srun = ["srun", "-N", "2", "-w", ",".join(TWO_HOSTS), "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    command = ["mlhpc", "run", "cosmoflow", "--config", "mini", "--seeds", "2", "--first-seed", "41"]
    command += ["--out", str(work / "short"), "--data", str(target_data), "--local-dir", local, *TO_TARGET]
    proc = vcluster.exec("login", [*srun, *command], cwd=work, check=False, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]  # a str: shown whole
    assert re.search(r"2 of \d+ runs: not yet a scoreable entry", proc.stdout), proc.stdout[-2000:]
    assert "srun: error" not in proc.stderr, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# Weak scaling: instances spread over the nodes


@pytest.mark.slow
def test_weak_scaling_spreads_ten_instances_over_four_hosts_and_scores_them(
    vcluster: VCluster, target_data: Path, local: str, work: Path
) -> None:
    """`srun -N 4 -n 10 mlhpc run --instances 10`: ten models at once, one rank each, three or
    two a node, each to the real target; `mlhpc check` scores the entry (models per minute).
    The system is the job's 4 hosts; each instance logs its own 1 node, so the checker warns
    that 10 one-node instances at once do not fit 4 nodes: true here, the instances share them."""
    out = work / "weak"
    command = ["srun", "-N", "4", "-n", "10", "--overcommit", "--kill-on-bad-exit=1"]
    command += ["mlhpc", "run", "cosmoflow", "--config", "mini", "--instances", "10", "--first-seed", "41"]
    command += ["--out", str(out), "--data", str(target_data), "--local-dir", local, "--no-check", *TO_TARGET]
    vcluster.exec("login", command, cwd=work, timeout=WEAK_TIMEOUT_S)
    logs = sorted((out / "mlhpc" / "results").glob("*/weak/cosmoflow/result_*.txt"))
    assert len(logs) == 10
    for log in logs:
        events = mllog_events(log)
        assert value(events, "number_of_nodes") == 1, log
        assert {e["metadata"].get("instance") for e in events} == {int(log.stem.split("_")[1])}
    described = system_json(out)
    assert (described["number_of_nodes"], described["system_name"]) == ("4", logs[0].parents[2].name)

    report = check_report(vcluster, out / "mlhpc", work / "check.json")
    (entry,) = report["entries"]
    assert errors(report) == [], report
    assert (entry["scaling"], entry["num_models"]) == ("weak", 10)
    assert entry["models_per_min"] > 0 and all(r["compliant"] for r in entry["runs"])
    (claim,) = [f["message"] for f in entry["findings"] if f["rule"] == "scale-claim"]
    assert "10 nodes at once" in claim and "has 4 nodes" in claim, claim


def test_a_weak_instance_spanning_two_hosts_counts_both(
    vcluster: VCluster, quick_data: Path, local: str, work: Path
) -> None:
    """`srun -N 2 -n 4 --distribution=cyclic --instances 2`: ranks 0 and 2 on node01, 1 and 3 on
    node02, so each instance (two consecutive ranks) spans both hosts. Each logs 2 nodes, and
    each node's copy of each instance's data is staged and removed by a rank of that node."""
    out = work / "weak"
    command = ["srun", "-N", "2", "-n", "4", "--distribution=cyclic", "--kill-on-bad-exit=1"]
    command += ["mlhpc", "run", "cosmoflow", "--config", "mini", "--instances", "2", "--first-seed", "11"]
    command += ["--out", str(out), "--data", str(quick_data), "--local-dir", local, "--no-check", *QUICK]
    vcluster.exec("login", command, cwd=work, timeout=RUN_TIMEOUT_S)
    logs = sorted((out / "mlhpc" / "results").glob("*/weak/cosmoflow/result_*.txt"))
    assert [value(mllog_events(log), "number_of_nodes") for log in logs] == [2, 2]
    assert system_json(out)["number_of_nodes"] == "2"
    for node in vcluster.nodes:
        folder = vcluster.local_dir(node) / Path(local).name
        assert not folder.exists() or not any(folder.iterdir()), (node, list(folder.iterdir()))


# ---------------------------------------------------------------------------------------------
# torchrun, mpirun and Horovod across two hosts


def test_torchrun_c10d_rendezvous_across_two_hosts_trains(
    vcluster: VCluster, quick_data: Path, local: str, param_bytes: int, work: Path
) -> None:
    """One torchrun agent on node01 and one on node02 (started by srun) meet at a c10d
    rendezvous on node01's address and run `mlhpc run` with one rank each."""
    out = work / "out"
    port = random.randint(30000, 39999)  # nothing else listens on a node's fresh network stack
    agent = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    agent += ["--rdzv-endpoint", f"node01:{port}", "--rdzv-id", f"mlhpc-{port}", "-m"]
    before = sent_bytes(vcluster)
    srun = ["srun", "-N", "2", "-w", ",".join(TWO_HOSTS), "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    vcluster.exec(
        "login", [*srun, *agent, *run_argv(out, quick_data, local, 31)], cwd=work, timeout=RUN_TIMEOUT_S
    )
    sent = {node: n - before[node] for node, n in sent_bytes(vcluster).items()}
    assert_trained_across(out, 31, TWO_HOSTS, sent, param_bytes, "mlhpc; launcher torchrun; backend gloo")


def need_mpi() -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin, as .ci/run does)")
    probe = subprocess.run(
        [sys.executable, "-c", "import mpi4py.MPI"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(
            "mpi4py does not import (pip install '.[mpi]'): without it, ranks started by mpirun on "
            "two hosts cannot learn rank 0's address"
        )


def test_mpirun_in_a_slurm_allocation_trains_across_two_hosts(
    vcluster: VCluster, quick_data: Path, local: str, param_bytes: int, work: Path
) -> None:
    """`salloc -N 2 mpirun`: Open MPI starts its daemons on the allocation's nodes through srun
    (no ssh), one rank a node; rank 0's host name reaches the others over MPI (mpi4py)."""
    need_mpi()
    out = work / "out"
    port = str(random.randint(30000, 39999))
    forward = [x for name in ("PATH", "OMP_NUM_THREADS", "MASTER_PORT") for x in ("-x", name)]
    command = ["salloc", "-N", "2", "-w", ",".join(TWO_HOSTS), "mpirun", "-np", "2", "--map-by", "ppr:1:node"]
    before = sent_bytes(vcluster)
    vcluster.exec(
        "login",
        [*command, *forward, *run_argv(out, quick_data, local, 21)],
        cwd=work,
        timeout=RUN_TIMEOUT_S,
        env={**OMPI_ROOT, "MASTER_PORT": port},
    )
    sent = {node: n - before[node] for node, n in sent_bytes(vcluster).items()}
    assert_trained_across(out, 21, TWO_HOSTS, sent, param_bytes, "mlhpc; launcher mpi; backend gloo")


def horovod_missing(vcluster: VCluster) -> str | None:
    """Why Horovod cannot train across the cluster's hosts here, or None."""
    wait_for_horovod_build()
    probe = subprocess.run(
        [sys.executable, "-c", "import horovod.torch as h; print(h.mpi_built())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return "horovod is not installed (an optional extra: scripts/install_horovod.sh)"
    if probe.stdout.strip() != "True":
        return (
            "this Horovod was built without MPI: under srun only its MPI controller starts without "
            "ssh; its Gloo controller needs horovodrun, which starts remote ranks over ssh (no sshd "
            "on the cluster's hosts). Rebuild with HOROVOD_WITH_MPI=1 (apt-get install libopenmpi-dev)"
        )
    plugins = vcluster.exec("login", ["srun", "--mpi=list"], check=False, timeout=30)
    if "pmix" not in plugins.stdout + plugins.stderr:
        return "this Slurm has no PMIx plugin (srun --mpi=list): Horovod's MPI cannot start under srun"
    return None


@pytest.mark.horovod
def test_horovod_under_srun_trains_across_two_hosts(
    vcluster: VCluster, quick_data: Path, local: str, param_bytes: int, work: Path
) -> None:
    """`srun --mpi=pmix mlhpc run --backend horovod`: each rank's MPI starts from Slurm's PMIx
    (no horovodrun, no ssh), and Horovod's MPI controller all-reduces across the two hosts."""
    reason = horovod_missing(vcluster)
    if reason:
        pytest.skip(reason)
    out = work / "out"
    srun = ["srun", "-N", "2", "-w", ",".join(TWO_HOSTS), "--ntasks-per-node=1", "--mpi=pmix"]
    before = sent_bytes(vcluster)
    vcluster.exec(
        "login",
        [*srun, "--kill-on-bad-exit=1", *run_argv(out, quick_data, local, 51), "--backend", "horovod"],
        cwd=work,
        timeout=RUN_TIMEOUT_S,
    )
    sent = {node: n - before[node] for node, n in sent_bytes(vcluster).items()}
    assert_trained_across(out, 51, TWO_HOSTS, sent, param_bytes, "mlhpc; launcher horovod; backend horovod")
