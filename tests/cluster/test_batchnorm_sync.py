"""Batch-norm statistics: each rank's own while training (DDP broadcasts no buffers per step), the
mean over the model's ranks before each evaluation (real 2-rank gloo group)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.launchers import torchrun

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
from pathlib import Path
import torch
from mlhpc.common.cluster.distributed import average_batchnorm_statistics, init_distributed
from mlhpc.common.cluster.group import shutdown_distributed

ctx = init_distributed("gloo", "cpu")
torch.manual_seed(0)
model = ctx.wrap_model(torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.BatchNorm2d(3)))
model.train()
# Each rank sees data with its own mean: its running statistics move apart from the other's.
inputs = torch.randn(4, 2, 5, 5) + 3.0 * ctx.rank
model(inputs).sum().backward()
bn = model.module[1]
before = {"mean": bn.running_mean.tolist(), "var": bn.running_var.tolist()}
average_batchnorm_statistics(model, ctx)
after = {"mean": bn.running_mean.tolist(), "var": bn.running_var.tolist()}
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps({"before": before, "after": after}))
ctx.barrier()
shutdown_distributed()
# torch 2.14 on gloo aborts at interpreter exit after a DDP backward in about 1 run in 10
# ("terminate called without an active exception", seen with a bare DDP script too): the test
# is about the statistics, already written, so it leaves without the teardown.
os._exit(0)
"""


def test_batchnorm_statistics_are_the_ranks_mean_after_the_sync(tmp_path: Path) -> None:
    script = tmp_path / "bn.py"
    script.write_text(SCRIPT)
    proc = torchrun([str(script), str(tmp_path)], REPO, timeout=300, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["before"]["mean"] != ranks[1]["before"]["mean"]  # no broadcast while training
    for stat in ("mean", "var"):
        expected = [(a + b) / 2 for a, b in zip(ranks[0]["before"][stat], ranks[1]["before"][stat], strict=True)]
        for rank in ranks:
            assert rank["after"][stat] == pytest.approx(expected, rel=1e-6)
