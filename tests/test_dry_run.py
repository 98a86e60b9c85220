"""`mlhpc run ... --dry-run`: the config (and the data) checked, the init events printed, nothing
built or written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import mlhpc_cli


def events(stdout: str) -> dict[str, object]:
    lines = [json.loads(line.split(":::MLLOG", 1)[1]) for line in stdout.splitlines() if ":::MLLOG" in line]
    return {e["key"]: e["value"] for e in lines}


def one_sample_dataset(root: Path, sample_size: int) -> Path:
    """A CosmoFlow dataset of one sparse sample per split: what validation reads, in no time."""
    for split in ("train", "validation"):
        folder = root / split
        folder.mkdir(parents=True)
        np.lib.format.open_memmap(folder / "x.npy", "w+", np.dtype("<i2"), (sample_size,) * 3 + (4,)).flush()
        np.save(folder / "y.npy", np.zeros(4, np.float32))
        (folder / "files_data.lst").write_text("x.npy\n")
        (folder / "files_label.lst").write_text("y.npy\n")
    return root


def test_dry_run_prints_the_rcp_hyperparameters_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    data = one_sample_dataset(tmp_path / "data", 128)  # rcp_512 without --data would generate TBs
    args = ["run", "cosmoflow", "--config", "rcp_512", "--out", str(out), "--data", str(data), "--dry-run"]
    proc = mlhpc_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    logged = events(proc.stdout)
    assert logged["global_batch_size"] == 512
    assert logged["opt_base_learning_rate"] == 0.024 and logged["opt_learning_rate_warmup_factor"] == 4.0
    assert logged["opt_learning_rate_decay_factor"] == [0.5, 0.25, 0.125, 0.0625]
    keys = list(logged)
    assert keys.index("init_start") < keys.index("seed") < keys.index("init_stop")
    assert "run_start" not in logged
    assert "Nothing was built" in proc.stdout
    assert not out.exists() and not (tmp_path / "local").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["loop.max_epoch=3"], "loop.max_epoch"),  # a typo in an override
        (["--config", "rcp_77"], "rcp_77"),
        (["--staging", "before", "--ruleset", "2.0.0"], "--staging before is not allowed"),
        (["loop.global_batch_size=3", "loop.gradient_accumulation_steps=2"], "not divisible"),
    ],
)
def test_dry_run_refuses_a_run_that_would_fail(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--dry-run", *extra], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dry_run_checks_the_data_it_is_given(tmp_path: Path) -> None:
    data = tmp_path / "not_a_dataset"
    data.mkdir()
    (data / "train").mkdir()
    proc = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(tmp_path / "runs"), "--data", str(data), "--dry-run"], tmp_path
    )
    assert proc.returncode != 0
    assert str(data) in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_shows_the_weak_scaling_plan_of_instances(tmp_path: Path) -> None:
    """One process with --instances N launches N ranks itself; its dry run plans for them."""
    out = tmp_path / "runs"
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(out), "--instances", "2", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "weak scaling" in proc.stdout and "2 instances at once on 1 rank(s) each" in proc.stdout
    assert not out.exists()
    # Under a launcher, the ranks it started must split into the instances.
    launched = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}
    refused = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(out), "--instances", "2", "--dry-run"], tmp_path, **launched
    )
    assert refused.returncode == 2 and "--instances 2 does not divide the 3 rank(s)" in refused.stderr


def config_id(*overrides: str) -> str:
    from mlhpc.campaign_io import resolve_config

    return resolve_config("cosmoflow", "mini", overrides).config_id


def record(out: Path, first_seed: int, config: str) -> None:
    entry = {"config": "mini", "config_id": config, "seeds": 3, "first_seed": first_seed}
    settings = {
        "submitter": "mlhpc",
        "system": "ci",
        "division": "closed",
        "status": "onprem",
        "ruleset": "3.0.0",
    }
    campaign = {
        "mlhpc_campaign": 1,
        "hardware": None,
        "settings": settings,
        "entries": {"cosmoflow/strong": entry},
    }
    out.mkdir(parents=True)
    (out / "campaign.json").write_text(json.dumps(campaign))


def test_dry_run_goes_through_the_planner(tmp_path: Path) -> None:
    """A dry run refuses what the run would: a changed config, another first seed, a taken index;
    and it follows the recorded first seed."""
    out = tmp_path / "runs"
    record(out, 700, config_id())
    before = (out / "campaign.json").read_bytes()
    base = ["run", "cosmoflow", "--out", str(out), "--dry-run"]

    follows = mlhpc_cli([*base, "--index", "2"], tmp_path)
    assert follows.returncode == 0, follows.stderr
    assert events(follows.stdout)["seed"] == 702 and "seeds [702]" in follows.stdout

    other_seed = mlhpc_cli([*base, "--index", "1", "--first-seed", "9"], tmp_path)
    assert other_seed.returncode == 2 and "first seed 700" in other_seed.stderr
    assert "drop --first-seed" in other_seed.stderr and other_seed.stderr.count("\n") == 1

    changed = mlhpc_cli([*base, "--index", "1", "loop.max_epochs=3"], tmp_path)
    assert changed.returncode == 2 and "pass the same --config and overrides" in changed.stderr

    folder = out / "mlhpc/results/ci/strong/cosmoflow"
    write_finished_log(folder / "result_1.txt", seed=701)
    taken = mlhpc_cli([*base, "--index", "1"], tmp_path)
    assert taken.returncode == 2 and "result_1.txt" in taken.stderr and "pick another --index" in taken.stderr
    assert (out / "campaign.json").read_bytes() == before  # a dry run writes nothing


def write_finished_log(path: Path, seed: int) -> None:
    """The lines of a result log that a resume reads as finished with `seed`."""
    events = [("POINT_IN_TIME", "seed", seed, {}), ("INTERVAL_START", "run_start", None, {})]
    events.append(("INTERVAL_END", "run_stop", None, {"status": "success"}))
    lines = [
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 1_700_000_000_000 + i,
                "event_type": kind,
                "key": key,
                "value": value,
                "metadata": metadata,
            }
        )
        for i, (kind, key, value, metadata) in enumerate(events)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
