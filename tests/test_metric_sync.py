"""Every metric reduces over exactly its own model's ranks: a weak-scaling job's instances never
pool their detections, and a data-parallel model's ranks always do (real 2-rank gloo groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_distributed import torchrun

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parent.parent

EVALUATE = """
import json, sys
from pathlib import Path
import torch
from mlhpc.benchmarks.extreme_weather import data
from mlhpc.common.distributed import init_distributed, shutdown_distributed

class FixedDetector(torch.nn.Module):
    '''Detects the box each image holds exactly (rank 0) or far away from it (rank 1).'''
    def __init__(self, right):
        super().__init__()
        self.right = right
    def forward(self, images):
        box = [2.0, 2.0, 10.0, 10.0] if self.right else [20.0, 20.0, 30.0, 30.0]
        return [{"boxes": torch.tensor([box]), "scores": torch.tensor([0.9]), "labels": torch.tensor([1])}
                for _ in range(images.shape[0])]

world = init_distributed("gloo", "cpu")
instances = int(sys.argv[2])
ctx = world.split(instances)
target = {"boxes": torch.tensor([[2.0, 2.0, 10.0, 10.0]]), "labels": torch.tensor([1])}
loader = [(torch.zeros(2, 1, 16, 16), [target, target])]
value = data.evaluate(FixedDetector(right=world.rank == 0), loader, ctx)
Path(sys.argv[1], f"rank{world.rank}.json").write_text(json.dumps({"map": value, "instance": ctx.instance}))
shutdown_distributed()
"""


@pytest.mark.parametrize("instances", [1, 2])
def test_extreme_weather_map_reduces_over_its_own_instance(tmp_path: Path, instances: int) -> None:
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE)
    proc = torchrun([str(script), str(tmp_path), str(instances)], REPO, timeout=300, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    maps = [json.loads((tmp_path / f"rank{rank}.json").read_text())["map"] for rank in (0, 1)]
    if instances == 2:
        # Each instance scores its own model: one perfect, one wrong; pooled they would agree.
        assert maps == [pytest.approx(1.0), pytest.approx(0.0)]
    else:
        # One model over two ranks: both see the pooled detections, and agree (on stopping too).
        assert maps[0] == maps[1] and 0.0 < maps[0] < 1.0
