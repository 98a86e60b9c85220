"""Every metric reduces over exactly its own model's ranks: a weak-scaling job's instances never
pool their detections, and a data-parallel model's ranks always do, whatever the number of
validation samples each rank holds (real 2-rank gloo groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mlhpc.benchmarks.extreme_weather import evaluation
from tests.helpers.launchers import torchrun
from tests.helpers.mllog_files import mllog_events

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]

EVALUATE = """
import json, sys
from pathlib import Path
import torch
from mlhpc.benchmarks.extreme_weather import evaluation
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed

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
value = evaluation.evaluate(FixedDetector(right=world.rank == 0), loader, ctx)
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


UNEVEN = """
import json, sys
from pathlib import Path
import torch
from mlhpc.benchmarks.extreme_weather import evaluation
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
from tests.cluster.test_metric_sync import detections, snapshots

class IndexDetector(torch.nn.Module):
    '''Each image is filled with its index; the detections depend on the index alone.'''
    def forward(self, images):
        return [detections(int(image[0, 0, 0])) for image in images]

ctx = init_distributed("gloo", "cpu")
report = {}
for total in json.loads(sys.argv[2]):
    # build_data's round-robin shards: rank 0 holds images 0, 2, ..., rank 1 images 1, 3, ...
    mine = [s for index, s in enumerate(snapshots(total)) if index % ctx.world_size == ctx.rank]
    loader = [(torch.stack([image for image, _ in mine[i:i + 2]]), [t for _, t in mine[i:i + 2]])
              for i in range(0, len(mine), 2)]
    report[total] = {"map": evaluation.evaluate(IndexDetector(), loader, ctx), "images": len(mine)}
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(report))
shutdown_distributed()
"""


def detections(index: int) -> dict[str, torch.Tensor]:
    """Image `index`'s detections: a hit on its box and a miss, scored by the index so that the
    precision-recall curve depends on every image (a lost or doubled image changes the mAP)."""
    hit, miss = _box(index), [40.0, 40.0, 50.0, 50.0]
    scores = [0.5 + 0.05 * (index % 7), 0.3 + 0.1 * (index % 5)]
    return {
        "boxes": torch.tensor([hit, miss]),
        "scores": torch.tensor(scores),
        "labels": torch.tensor([1 + index % 2, 1]),
    }


def snapshots(total: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """`total` images filled with their index, each with one box of class 1 or 2; every third
    image also holds a box of class 1 no detection finds."""
    out = []
    for index in range(total):
        boxes = [_box(index)] + ([[60.0, 60.0, 70.0, 70.0]] if index % 3 == 0 else [])
        labels = [1 + index % 2] + ([1] if index % 3 == 0 else [])
        target = {"boxes": torch.tensor(boxes), "labels": torch.tensor(labels)}
        out.append((torch.full((1, 16, 16), float(index)), target))
    return out


def _box(index: int) -> list[float]:
    corner = float(index % 4)
    return [corner, corner, corner + 10.0, corner + 10.0]


def test_extreme_weather_map_on_uneven_shards_is_the_one_rank_map(tmp_path: Path) -> None:
    """3 and 5 images: the ranks hold 2 and 1, 3 and 2 (torchmetrics' own sync failed with
    'Received data size doesn't match expected size'); 1 image: rank 1 holds none."""
    totals = [1, 3, 5]
    script = tmp_path / "evaluate.py"
    script.write_text(UNEVEN)
    proc = torchrun([str(script), str(tmp_path), json.dumps(totals)], REPO, timeout=300, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for total in totals:
        assert [r[str(total)]["images"] for r in reports] == [(total + 1) // 2, total // 2]
        images = snapshots(total)
        one_rank = evaluation.map_at_iou([detections(i) for i in range(total)], [t for _, t in images])
        assert 0.0 < one_rank < 1.0
        assert [r[str(total)]["map"] for r in reports] == [one_rank, one_rank], total


def test_two_rank_extreme_weather_run_with_an_odd_validation_set_finishes(tmp_path: Path) -> None:
    """3 validation snapshots over 2 ranks (2 and 1), tiny fields: seconds, not minutes."""
    out = tmp_path / "out"
    args = ["-m", "mlhpc", "run", "extreme_weather", "--seeds", "1", "--first-seed", "1"]
    args += ["--out", str(out), "--system", "ci_cpu_n2", "--backend", "gloo", "--no-check"]
    args += ["data.height=64", "data.width=96", "data.num_train_samples=8", "data.num_eval_samples=3"]
    args += ["loop.global_batch_size=4", "loop.mode=fixed_epochs", "loop.max_epochs=2"]
    proc = torchrun(args, tmp_path, timeout=300, MLHPC_LOCAL_DIR=str(tmp_path / "local"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    events = mllog_events(out / "mlhpc/results/ci_cpu_n2/strong/extreme_weather/result_0.txt")
    values = {e["key"]: e["value"] for e in events}
    assert values["eval_samples"] == 3
    assert len([e for e in events if e["key"] == "eval_accuracy"]) == 2
    assert next(e for e in events if e["key"] == "run_stop")["metadata"]["status"] == "success"
