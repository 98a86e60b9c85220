"""Extreme weather's mAP from uneven validation shards: whatever the rank count and however many
snapshots each rank holds (none included), the gathered mAP is the one-process mAP over the whole
validation set, ties in the scores included (COCO breaks them by image order)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.extreme_weather import evaluation

Image = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]

# Few corners and scores: boxes overlap, detections tie, and classes share images.
_corner = st.integers(min_value=0, max_value=3).map(lambda c: 4.0 * c)
_box = st.tuples(_corner, _corner, st.sampled_from([6.0, 10.0])).map(
    lambda b: [b[0], b[1], b[0] + b[2], b[1] + b[2]]
)
_label = st.integers(min_value=1, max_value=2)
_score = st.sampled_from([0.2, 0.5, 0.9])


@st.composite
def images(draw: st.DrawFn) -> Image:
    found = draw(st.lists(st.tuples(_box, _score, _label), max_size=3))
    boxes = draw(st.lists(st.tuples(_box, _label), max_size=3))
    detections = {
        "boxes": torch.tensor([b for b, _, _ in found], dtype=torch.float32).reshape(-1, 4),
        "scores": torch.tensor([s for _, s, _ in found], dtype=torch.float32),
        "labels": torch.tensor([c for _, _, c in found], dtype=torch.int64),
    }
    target = {
        "boxes": torch.tensor([b for b, _ in boxes], dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor([c for _, c in boxes], dtype=torch.int64),
    }
    return detections, target


def one_process_map(validation: list[Image]) -> float:
    """The mAP one rank computes over the whole validation set, one image at a time."""
    metric = evaluation.mean_average_precision()
    for detections, target in validation:
        metric.update([detections], [target])
    return max(float(metric.compute()["map"]), 0.0) if validation else 0.0


@settings(max_examples=100, deadline=None)
@given(validation=st.lists(images(), max_size=10), world=st.integers(min_value=1, max_value=8))
def test_gathered_map_of_any_shards_is_the_one_process_map(validation: list[Image], world: int) -> None:
    shards = [validation[rank::world] for rank in range(world)]  # build_data's round-robin shards
    assert evaluation.merge_shards(shards) == validation
    assert evaluation.gathered_map(shards) == one_process_map(validation)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=5), min_size=2, max_size=6),
)
def test_shards_that_round_robin_cannot_give_are_refused(lengths: list[int]) -> None:
    total, world = sum(lengths), len(lengths)
    parts = [list(range(n)) for n in lengths]
    if lengths == [len(range(rank, total, world)) for rank in range(world)]:
        assert len(evaluation.merge_shards(parts)) == total
    else:
        with pytest.raises(ValueError, match="round-robin"):
            evaluation.merge_shards(parts)


def test_an_empty_validation_set_scores_zero() -> None:
    assert evaluation.gathered_map([[], [], []]) == 0.0
