"""CosmoFlow's MAE and DeepCAM's IoU on uneven validation shards: the loaders' round-robin shards
of 3 samples over 2 real gloo ranks (2 and 1) and of 1 sample (rank 1 holds none) give the value
one process computes over the whole set. Extreme weather's mAP: tests/cluster/test_metric_sync.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mlhpc.benchmarks.cosmoflow import data as cosmoflow
from mlhpc.benchmarks.deepcam import data as deepcam
from mlhpc.common.cluster.distributed import init_distributed
from tests.helpers.launchers import torchrun

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]

EVALUATE = """
import json, sys
from pathlib import Path
from mlhpc.benchmarks.cosmoflow import data as cosmoflow
from mlhpc.benchmarks.deepcam import data as deepcam
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.cluster.group import shutdown_distributed
from mlhpc.common.training.loaders import torch_data_bundle
from mlhpc.common.training.loop_config import LoopConfig
from tests.cluster.test_uneven_shards import CubeMean, FieldClass, cosmo_set, deepcam_set

ctx = init_distributed("gloo", "cpu")
loop = LoopConfig(global_batch_size=2, max_epochs=1, target=0.0)
report = {}
for total in json.loads(sys.argv[2]):
    values = {}
    for name, module, model, dataset in (("cosmoflow", cosmoflow, CubeMean(), cosmo_set),
                                         ("deepcam", deepcam, FieldClass(), deepcam_set)):
        bundle = torch_data_bundle(dataset(4), dataset(total), loop=loop, ctx=ctx, seed=1,
                                   num_workers=0, where="memory")
        values[name] = module.evaluate(model, bundle.validation, ctx)
    values["samples"] = sum(len(batch[1]) for batch in bundle.validation)
    report[total] = values
Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(report))
shutdown_distributed()
"""


class CubeMean(torch.nn.Module):
    """CosmoFlow's four targets predicted as the cube's mean: a different error per sample."""

    def forward(self, cube: torch.Tensor) -> torch.Tensor:
        return cube.flatten(1).mean(dim=1, keepdim=True).expand(-1, 4)


class FieldClass(torch.nn.Module):
    """DeepCAM logits that pick the class written in channel 0."""

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        return F.one_hot(fields[:, 0].long(), deepcam.NUM_CLASSES).permute(0, 3, 1, 2).float()


def cosmo_set(total: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(total)
    cubes = torch.rand(total, 1, 4, 4, 4, generator=generator)
    return torch.utils.data.TensorDataset(cubes, torch.rand(total, 4, generator=generator))


def deepcam_set(total: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(total)
    predicted = torch.randint(0, deepcam.NUM_CLASSES, (total, 1, 4, 6), generator=generator)
    fields = torch.cat([predicted.float(), torch.zeros(total, 15, 4, 6)], dim=1)
    return torch.utils.data.TensorDataset(fields, torch.randint(0, 3, (total, 4, 6), generator=generator))


def test_mae_and_iou_on_uneven_shards_are_the_one_process_values(tmp_path: Path) -> None:
    totals = [1, 3]
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE)
    proc = torchrun([str(script), str(tmp_path), json.dumps(totals)], REPO, timeout=300, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    one = init_distributed("gloo", "cpu")  # a plain process: a world of one
    for total in totals:
        assert [r[str(total)]["samples"] for r in reports] == [(total + 1) // 2, total // 2]
        whole = {
            "cosmoflow": cosmoflow.evaluate(CubeMean(), [cosmo_set(total).tensors], one),
            "deepcam": deepcam.evaluate(FieldClass(), [deepcam_set(total).tensors], one),
        }
        for name, value in whole.items():
            assert [r[str(total)][name] for r in reports] == [pytest.approx(value, rel=1e-12)] * 2, name
