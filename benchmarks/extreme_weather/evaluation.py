"""ExtremeWeather's quality: mAP at IoU 0.5 over every validation snapshot, gathered from the
ranks' shards so that it equals the one-process mAP exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from mlhpc.common.cluster.distributed import DistContext

IOU_THRESHOLD = 0.5
"""HPC AI500's quality is mAP at IoU 0.5."""

Boxes = dict[str, torch.Tensor]
"""One image's detections (boxes, scores, labels) or target (boxes, labels)."""
_Item = TypeVar("_Item")


def mean_average_precision() -> Any:
    """torchmetrics' COCO mAP (pycocotools backend) at IoU 0.5 only: HPC AI500's mAP@[IoU=0.5].
    It never syncs: torchmetrics syncs one tensor per image, a different number of collectives
    on ranks holding different numbers of images; `evaluate` gathers every image first."""
    from torchmetrics.detection import MeanAveragePrecision

    return MeanAveragePrecision(
        box_format="xyxy",
        iou_type="bbox",
        iou_thresholds=[IOU_THRESHOLD],
        backend="pycocotools",
        sync_on_compute=False,
        distributed_available_fn=lambda: False,
    )


def map_at_iou(detections: Sequence[Boxes], targets: Sequence[Boxes]) -> float:
    """mAP@0.5 of these images' detections, in one process; 0 when there is nothing to score
    (COCO reports -1)."""
    if not detections:
        return 0.0
    metric = mean_average_precision()
    metric.update(list(detections), list(targets))
    return max(float(metric.compute()["map"]), 0.0)


def merge_shards(parts: Sequence[Sequence[_Item]]) -> list[_Item]:
    """The ranks' round-robin validation shards (rank r of W holds samples r, r+W, ...) back in
    sample order, so that the gathered mAP is the one-process mAP exactly: COCO breaks score ties
    by image order."""
    world, total = len(parts), sum(len(part) for part in parts)
    merged: list[Any] = [None] * total
    for rank, part in enumerate(parts):
        expected = len(range(rank, total, world))
        if len(part) != expected:
            raise ValueError(
                f"rank {rank} of {world} evaluated {len(part)} of the {total} validation snapshots, "
                f"where the round-robin shards give it {expected}"
            )
        merged[rank::world] = part
    return merged


def evaluate(model: torch.nn.Module, loader: Any, ctx: DistContext) -> float:
    """mAP@0.5 over every validation snapshot of this model's ranks (one instance's group in a
    weak-scaling job): one gather of every rank's detections and targets, whatever the number of
    snapshots each holds, then the same mAP on every rank."""
    local: list[tuple[Boxes, Boxes]] = []
    for images, targets in loader:
        detections = model(images.to(ctx.device))
        for found, target in zip(detections, targets, strict=True):
            local.append(
                (
                    {k: found[k].detach().cpu() for k in ("boxes", "scores", "labels")},
                    {k: target[k].cpu() for k in ("boxes", "labels")},
                )
            )
    return gathered_map(ctx.all_gather_object(local))


def gathered_map(parts: Sequence[Sequence[tuple[Boxes, Boxes]]]) -> float:
    """mAP@0.5 of every rank's (detections, target) pairs, as one process over the whole
    validation set computes it."""
    images = merge_shards(parts)
    return map_at_iou([found for found, _ in images], [target for _, target in images])
