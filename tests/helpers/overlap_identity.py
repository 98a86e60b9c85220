"""One CosmoFlow run through the real loop with a given `--staging` mode, for the overlap
identity tests: `python -m tests.helpers.overlap_identity DATA OUT MODE [COPY_DELAY_S]`, alone or
under torchrun. It writes OUT/MODE.json (a hash of every parameter after each epoch, the
overlap's figures) and OUT/MODE.txt (the MLLOG result).

COPY_DELAY_S slows staging (`slow_staging`), so that training reaches files before staging does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.campaign.local import overlapped_staging
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.training.loop import StagedData, SubmissionInfo, train_to_target
from mlhpc.common.training.mllogger import MLLog
from mlhpc.staging import StageRequest, comm_for, stage_dataset
from tests.helpers.slow_staging import slow_staging

EPOCHS = 3


def main(data: Path, out: Path, mode: str, delay: float) -> None:
    ctx = init_distributed(backend="gloo", device="cpu")
    bench = registry.get("cosmoflow")
    cfg = load_config(
        CosmoFlowConfig,
        bench.config_path("mini"),
        [
            "data.num_train_samples=32",
            "data.num_eval_samples=8",
            "loop.mode=fixed_epochs",
            f"loop.max_epochs={EPOCHS}",
        ],
    )
    snapshots: list[str] = []
    evaluate = bench.evaluate

    def recording(model: Any, loader: Any, ctx_: Any) -> float:
        digest = hashlib.sha256()
        for name, tensor in model.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        snapshots.append(digest.hexdigest())
        return evaluate(model, loader, ctx_)

    bench = dataclasses.replace(bench, evaluate=recording)
    if delay:
        slow_staging(delay)
    stage_dir = out / f"node-{mode}"  # the ranks of a node share it, as a campaign's do
    request = StageRequest(
        data, stage_dir / "data", claims=stage_dir / "claims" if mode == "overlap" else None
    )
    comm = comm_for(ctx, beside_training=mode == "overlap")

    def stage() -> StagedData:
        return StagedData(path=request.dest, metadata=stage_dataset(request, comm).metadata())

    log = MLLog(out / f"{mode}.txt", enabled=ctx.is_main, echo=False)
    result = train_to_target(
        bench,
        cfg,
        ctx,
        log,
        seed=7,
        submission=SubmissionInfo(submitter="mlhpc", system="ci_cpu"),
        stage=stage,
        staging=mode,  # type: ignore[arg-type]
        start_staging=overlapped_staging(request, comm) if mode == "overlap" else None,
    )
    log.close()
    if ctx.is_main:
        assert result.breakdown is not None
        record = {
            "snapshots": snapshots,
            "status": result.status,
            "overlap": result.breakdown.overlapped_staging,
        }
        (out / f"{mode}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
