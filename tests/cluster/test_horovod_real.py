"""Horovod for real, on one node: `horovodrun` (Gloo controller) and `mpirun` (MPI controller)
start two ranks of `mlhpc run cosmoflow --config mini --backend horovod`, and two fp16 ranks end
with the same parameters although each trained on its own shard. Nothing is mocked.

Horovod has no wheel: `.ci/run` builds it into the venv with scripts/install_horovod.sh. Where
that failed, these tests skip and say so (the CI log holds the build's last lines)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.benchmarks.cosmoflow import data as cosmo_data_module
from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from tests.helpers.cli import cli_env
from tests.helpers.horovod_build import wait_for_horovod_build
from tests.helpers.mllog_files import mllog_events

PYTHON = sys.executable
# horovodrun sits beside the venv's python; .ci/run calls .venv/bin/pytest without activating it.
HOROVODRUN = Path(PYTHON).parent / "horovodrun"
# Any first evaluation meets this target: one short epoch, for the runs that test the launch.
QUICK = ["data.num_train_samples=256", "data.num_eval_samples=32", "loop.max_epochs=2", "loop.target=2.0"]
# The checked run keeps the real target (MAE 0.124): seed 41 reaches it in 6 epochs on 2 ranks.
CHECKED = ["data.num_train_samples=1024", "data.num_eval_samples=64", "loop.max_epochs=20"]
LAUNCH_TIMEOUT_S = 300
OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.horovod]


@pytest.fixture(scope="module")
def horovod() -> dict[str, bool]:
    """Which controllers this venv's Horovod was built with; the module skips without Horovod."""
    wait_for_horovod_build()
    probe = "import json, horovod.torch as h; print(json.dumps(dict(gloo=h.gloo_built(), mpi=h.mpi_built())))"
    proc = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(
            f"scripts/install_horovod.sh did not build horovod: see CI log ({last}; "
            "PYTHON=.venv/bin/python scripts/install_horovod.sh builds it)"
        )
    if not HOROVODRUN.exists():
        pytest.skip(f"horovod imports but {HOROVODRUN} is missing; rerun scripts/install_horovod.sh")
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset QUICK asks for, generated once for the module."""
    from mlhpc.staging import build_manifest
    from mlhpc.staging.manifest import MANIFEST_NAME

    cfg = load_config(CosmoFlowConfig, registry.get("cosmoflow").config_path("mini"), QUICK)
    root = tmp_path_factory.mktemp("horovod-data") / "cosmoflow"
    cosmo_data_module.generate(cfg, root, seed=3)
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`command` to its end, or killed with its process group after LAUNCH_TIMEOUT_S: a Horovod
    collective that never completes waits forever (horovodrun's workers die with it)."""
    with subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"{Path(command[0]).name} ran past {LAUNCH_TIMEOUT_S} s (a collective that never "
                f"completed?); killed\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
            )
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def horovodrun(*args: str) -> list[str]:
    return [str(HOROVODRUN), "--gloo", "-np", "2", "-H", "localhost:2", *args]


def mlhpc_run(out: Path, seed: int, *overrides: str, data: Path | None = None) -> list[str]:
    command = [PYTHON, "-m", "mlhpc", "run", "cosmoflow", "--config", "mini", "--seeds", "1"]
    command += ["--first-seed", str(seed), "--out", str(out), "--no-check", "--backend", "horovod"]
    return [*command, *(["--data", str(data)] if data else []), *overrides]


def trained_log(out: Path, seed: int) -> list[dict]:
    """The MLLOG events of the one result in `out`: `seed`, filed under a 2-rank system, success."""
    (log,) = sorted(out.glob("mlhpc/results/*/strong/cosmoflow/result_*.txt"))
    assert log.parents[2].name.endswith("_n2"), log
    events = mllog_events(log)
    keys = [e["key"] for e in events]
    for key in ("init_start", "staging_stop", "run_start", "epoch_start", "eval_error", "run_stop"):
        assert key in keys, f"{log}: no {key}"
    assert next(e["value"] for e in events if e["key"] == "seed") == seed
    stop = next(e for e in events if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success", stop
    return events


def breakdown(out: Path) -> dict:
    (path,) = out.glob("breakdown/mlhpc/*/strong/cosmoflow/result_0.json")
    return json.loads(path.read_text())


def sw_notes(out: Path) -> str:
    (system,) = out.glob("mlhpc/systems/*.json")
    return json.loads(system.read_text())["sw_notes"]


def test_horovodrun_trains_to_target_and_the_result_checks(horovod: dict[str, bool], tmp_path: Path) -> None:
    """Two Gloo ranks under horovodrun train to the real target; `mlhpc check` finds nothing
    wrong but the run count (one run where a score needs ten)."""
    out = tmp_path / "out"
    env = cli_env(OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    proc = run(horovodrun(*mlhpc_run(out, 41, *CHECKED)), env, tmp_path)
    assert proc.returncode == 0, output(proc)
    trained_log(out, 41)
    assert sw_notes(out) == "mlhpc; launcher horovod; backend horovod"
    # Every rank's samples, summed through Horovod's all-reduce: 1,024 an epoch, not one rank's 512.
    record = breakdown(out)
    assert record["train_samples_seen"] % 1024 == 0 and record["train_samples_seen"] >= 1024, record

    report = tmp_path / "check.json"
    checked = run(
        [PYTHON, "-m", "mlhpc", "check", str(out / "mlhpc"), "--json", str(report)], cli_env(), tmp_path
    )
    assert checked.returncode == 1, output(checked)  # 1: findings (the run count), not a crash
    found = json.loads(report.read_text())
    (entry,) = found["entries"]
    errors = [f["rule"] for f in found["findings"] + entry["findings"] if f["severity"] == "error"]
    assert errors == ["run-count"], found
    assert [r["compliant"] for r in entry["runs"]] == [True], entry["runs"]


# Trains through the shared loop itself, so that each rank can hash its model and its first batch:
# equal parameters after training on different batches show the gradients were all-reduced.
FP16_RANK = """
import dataclasses, hashlib, json, sys
from pathlib import Path
import torch
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.training.loop import StagedData, SubmissionInfo, train_to_target
from mlhpc.common.training.mllogger import MLLog

data, out, *overrides = sys.argv[1:]
ctx = init_distributed("horovod", "cpu")
bench = registry.get("cosmoflow")
cfg = load_config(bench.config_class, bench.config_path("mini"), overrides)
seen = {}
models = []

def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()

def build_model(cfg):
    models.append(registry.get("cosmoflow").build_model(cfg))
    return models[0]

def compute_loss(model, batch):
    if "first_batch" not in seen:
        seen["first_batch"] = digest([t for t in batch if torch.is_tensor(t)])
        seen["initial"] = digest(models[0].state_dict().values())
        seen["autocast"] = [torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu"))]
    return bench.compute_loss(model, batch)

hooked = dataclasses.replace(bench, build_model=build_model, compute_loss=compute_loss)
log = MLLog(Path(out) / "result_0.txt", enabled=ctx.is_main, echo=False)
result = train_to_target(
    hooked, cfg, ctx, log, seed=7, submission=SubmissionInfo(submitter="test", system="test_n2"),
    stage=lambda: StagedData(path=Path(data)),
)
log.close()
Path(out, f"rank{ctx.rank}.json").write_text(json.dumps(dict(
    seen, rank=ctx.rank, size=ctx.world_size, backend=ctx.backend, status=result.status,
    epochs=result.epochs, final=digest(models[0].state_dict().values()),
)))
"""


def test_fp16_ranks_all_reduce_to_equal_parameters(
    horovod: dict[str, bool], tiny_data: Path, tmp_path: Path
) -> None:
    """loop.precision=fp16 under Horovod: autocast to float16, one GradScaler, and Horovod's
    all-reduce finished (optimizer.synchronize) before the scaler unscales. Each rank's first
    batch differs, yet both end with the same parameters, moved from where they started."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "fp16_rank.py"
    script.write_text(FP16_RANK)
    env = cli_env(OMP_NUM_THREADS="1")
    command = horovodrun(PYTHON, str(script), str(tiny_data), str(out), *QUICK, "loop.precision=fp16")
    proc = run(command, env, tmp_path)
    assert proc.returncode == 0, output(proc)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert (rank["size"], rank["backend"], rank["status"]) == (2, "horovod", "success"), rank
        assert rank["autocast"] == [True, "torch.float16"], rank
        assert rank["final"] != rank["initial"], "the optimizer never stepped (every fp16 step skipped?)"
    assert ranks[0]["first_batch"] != ranks[1]["first_batch"], "both ranks read the same batch"
    assert ranks[0]["initial"] == ranks[1]["initial"]
    assert ranks[0]["final"] == ranks[1]["final"], "the ranks' parameters differ: no gradient all-reduce"
    events = mllog_events(out / "result_0.txt")
    assert next(e for e in events if e["key"] == "run_stop")["metadata"]["status"] == "success"


# A channels-last model (CosmoFlow's and DeepCAM's layout) with a stateful optimizer: Horovod's
# collectives take only contiguous tensors, and such a model's parameters, gradients and Adam
# state are all channels-last. Each rank starts from its own parameters and rank 0 alone has
# optimizer state, as after a resume; the ranks then train on different batches.
CHANNELS_LAST_RANK = """
import hashlib, json, sys
import torch
from mlhpc.common.cluster.distributed import init_distributed

out = sys.argv[1]
ctx = init_distributed("horovod", "cpu")
torch.manual_seed(ctx.rank)
model = torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(1))
model(torch.zeros(1, 2, 5, 5, 5))
model = model.to(memory_format=torch.channels_last_3d)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

def step(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2, 5, 5, 5, generator=g).contiguous(memory_format=torch.channels_last_3d)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()

def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()

def state():
    return [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]

if ctx.rank == 0:
    step(100)
layouts = [p.is_contiguous() for p in model.parameters()] + [t.is_contiguous() for t in state()]
optimizer = ctx.wrap_optimizer(optimizer, model)
synced = dict(params=digest(model.parameters()), state=digest(state()))
step(200 + ctx.rank)
json.dump(dict(synced, layouts=layouts, final=digest(model.parameters()),
               weight=model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)),
          open(f"{out}/rank{ctx.rank}.json", "w"))
"""


def test_channels_last_model_and_optimizer_state_broadcast_and_all_reduce(
    horovod: dict[str, bool], tmp_path: Path
) -> None:
    """Rank 0's channels-last parameters and Adam state reach rank 1, the channels-last gradients
    are all-reduced (equal parameters after a step on different batches), and the model keeps
    its layout."""
    script = tmp_path / "channels_last_rank.py"
    script.write_text(CHANNELS_LAST_RANK)
    proc = run(horovodrun(PYTHON, str(script), str(tmp_path)), cli_env(OMP_NUM_THREADS="1"), tmp_path)
    assert proc.returncode == 0, output(proc)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert False in ranks[0]["layouts"], "the test model has no non-contiguous tensor to send"
    assert ranks[0]["params"] == ranks[1]["params"], "rank 0's parameters did not reach rank 1"
    assert ranks[0]["state"] == ranks[1]["state"], "rank 0's optimizer state did not reach rank 1"
    assert ranks[0]["final"] == ranks[1]["final"], "the ranks' parameters differ: no gradient all-reduce"
    assert ranks[0]["final"] != ranks[0]["params"]
    assert ranks[0]["weight"] and ranks[1]["weight"], "the model lost its channels-last layout"


def test_mpirun_starts_horovod_ranks(horovod: dict[str, bool], tiny_data: Path, tmp_path: Path) -> None:
    """Open MPI's mpirun, not horovodrun: Horovod's MPI controller; no ssh, no rendezvous server."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin libopenmpi-dev, as .ci/run does)")
    if not horovod["mpi"]:
        pytest.skip("this horovod was built without MPI (no mpicxx when scripts/install_horovod.sh ran)")
    out = tmp_path / "out"
    env = cli_env(**OMPI_ROOT, OMP_NUM_THREADS="1", MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    forward = [x for name in ("PATH", "OMP_NUM_THREADS", "MLHPC_LOCAL_DIR") for x in ("-x", name)]
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", *forward]
    proc = run([*command, *mlhpc_run(out, 61, *QUICK, data=tiny_data)], env, tmp_path)
    assert proc.returncode == 0, output(proc)
    trained_log(out, 61)
    assert breakdown(out)["train_samples_seen"] == 256
