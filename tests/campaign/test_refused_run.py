"""A refused `mlhpc run` leaves --out exactly as it found it (no campaign.json, no lock file, no
folder), and the corrected command is then accepted without --resume. Each refusal kind: a
wrong --data, an environment check (a fake mismatched torchvision on PYTHONPATH), a config
check (a batch larger than the data), and the planner's own refusal of an --out in use."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers.cli import mlhpc_cli
from tests.helpers.site_packages import fake_torchvision

NMS_MISSING = "raise RuntimeError('operator torchvision::nms does not exist')\n"
"""What a torchvision built for another torch does on import."""

SMALL = [
    "data.num_train_samples=32",
    "data.num_eval_samples=16",
    "loop.max_epochs=1",
    "loop.target=100",  # reached after the first epoch: the run is short, and succeeds
]


def snapshot(root: Path) -> dict[str, str] | None:
    """Every entry under `root`: kind and content hash (None: no such folder)."""
    if not root.exists():
        return None
    found = {}
    for path in sorted(root.rglob("*")):
        kind = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        found[path.relative_to(root).as_posix()] = kind
    return found


def refused(args: list[str], cwd: Path, out: Path, expected: str, **env: str) -> None:
    before = snapshot(out)
    proc = mlhpc_cli(args, cwd, **env)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0], proc.stderr
    assert snapshot(out) == before


@pytest.mark.parametrize("out_exists", [False, True])
def test_each_refusal_leaves_out_as_it_was(tmp_path: Path, out_exists: bool) -> None:
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    (tmp_path / "empty").mkdir()
    base = ["run", "cosmoflow", "--out", str(out), "--system", "ci", "--no-check", *SMALL]
    refused([*base, "--data", str(tmp_path / "empty")], tmp_path, out, "check --data")
    refused([*base, "loop.global_batch_size=64"], tmp_path, out, "is more than data.num_train_samples=32")
    deepcam = ["run", "deepcam", "--out", str(out), "--system", "ci"]
    refused(
        deepcam,
        tmp_path,
        out,
        "torchvision 0.28.0 is built for torch==2.13.0",
        PYTHONPATH=str(fake_torchvision(tmp_path, "0.28.0", "torch==2.13.0", NMS_MISSING)),
    )
    # The corrected command: accepted as a new campaign (no --resume), and it trains.
    done = mlhpc_cli([*base, "--first-seed", "7"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((out / "campaign.json").read_text())
    assert record["entries"]["cosmoflow/strong"]["first_seed"] == 7
    if out_exists:
        assert (out / "notes.txt").read_text() == "mine\n"


def test_a_planner_refusal_makes_no_lock_file(tmp_path: Path) -> None:
    """An --out whose campaign.json records the campaign: refused without --resume, untouched."""
    out = tmp_path / "out"
    out.mkdir()
    entry = {"config": "mini", "config_id": "x", "num_runs": 1, "first_seed": 5}
    record = {"mlhpc_campaign": 1, "settings": {"system": "ci"}, "entries": {"cosmoflow/strong": entry}}
    (out / "campaign.json").write_text(json.dumps(record))
    refused(["run", "cosmoflow", "--out", str(out), *SMALL], tmp_path, out, "pass the same --config")
