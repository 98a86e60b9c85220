"""The runner's choices: a benchmark without an example batch keeps the levels it can, and the timed
levels train in the config's precision, as the loop does."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from mlhpc.characterize import runner
from mlhpc.characterize.bench_workload import BenchWorkload
from mlhpc.characterize.runner import CharacterizeOptions, characterize
from mlhpc.common.contract import registry


def test_a_benchmark_without_an_example_batch_keeps_the_io_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = registry.get("cosmoflow")
    bare = dataclasses.replace(real, example_batch=None)
    monkeypatch.setattr(runner.registry, "get", lambda name: bare if name == "cosmoflow" else real)
    out = tmp_path / "out"
    said: list[str] = []
    options = CharacterizeOptions(benchmark="cosmoflow", config="mini", out=out, io_samples=2, ranks=1)
    report = characterize(options, say=said.append)
    skipped = report["skipped"]
    assert set(skipped) == {"analytic", "operators", "roofline", "memory", "communication"}
    assert all("no example_batch" in reason for reason in skipped.values())
    assert report["analytic"] is None and report["published"] is None
    assert report["io"]["samples"] == 2
    on_disk = json.loads((out / "characterize.json").read_text())
    assert on_disk["skipped"] == skipped
    page = (out / "characterize.html").read_text()
    assert "no example_batch" in page and 'id="io"' in page and 'id="analytic"' not in page
    assert not list(out.glob(".characterize-data-*"))


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_timed_levels_train_in_the_configs_precision(precision: str, dtype: torch.dtype) -> None:
    workload = BenchWorkload("cosmoflow", "mini", (f"loop.precision={precision}",), 2, "cpu")()
    seen: list[torch.dtype] = []
    workload.model.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    loss = workload.step()
    assert seen == [dtype] and torch.isfinite(loss)
