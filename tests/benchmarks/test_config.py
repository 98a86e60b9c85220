"""Config loading: YAML into typed dataclasses, overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config, parse_overrides, to_dict
from mlhpc.common.errors import ConfigError


def test_packaged_configs_load(cosmo_cfg) -> None:
    full = cosmo_cfg(name="full")
    assert full.data.sample_size == 128
    assert full.data.num_train_samples == 524288
    assert full.data.num_eval_samples == 65536
    assert full.optimizer.base_learning_rate == 0.001
    assert full.optimizer.base_batch_size == 64
    assert full.optimizer.warmup_epochs == 4
    assert full.optimizer.decay_boundary_epochs == (16, 32)  # the RCP reference at batch 64
    assert full.optimizer.decay_factors == (0.25, 0.125)
    assert full.optimizer.weight_decay == 0.01
    assert full.model.dropout == 0.0
    assert full.loop.target == 0.124
    mini = cosmo_cfg()
    assert mini.loop.target == 0.124  # the official rules fix the target, mini too


def test_overrides_are_typed(cosmo_cfg) -> None:
    cfg = cosmo_cfg("loop.max_epochs=3", "optimizer.base_learning_rate=1", "model.dense_units=[32, 16]")
    assert cfg.loop.max_epochs == 3
    assert isinstance(cfg.optimizer.base_learning_rate, float)
    assert cfg.model.dense_units == (32, 16)
    assert to_dict(cfg)["model"]["dense_units"] == [32, 16]


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("loop.max_epoch=3", "loop.max_epoch"),
        ("nosuch.key=1", "nosuch"),
        ("loop.max_epochs=three", "loop.max_epochs"),
        ("loop.max_epochs=true", "loop.max_epochs"),
        ("data.loader=tf", "data.loader"),
        ("optimizer.decay_factors=[0.5, 0.25, 0.1]", "decay_factors"),
        ("loop.max_epochs", "key=value"),
    ],
)
def test_bad_keys_and_values_name_the_key(cosmo_cfg, override: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace("[", r"\[")) as info:
        cosmo_cfg(override)
    assert "\n" not in str(info.value)


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("data: {sample_size: 8, num_train_samples: 4}\nmodel: {}\noptimizer: {}\nloop: {}\n")
    with pytest.raises(ConfigError, match=r"data\.num_eval_samples"):
        load_config(CosmoFlowConfig, path)


def test_unknown_config_name_lists_known() -> None:
    with pytest.raises(ConfigError, match="known: full, mini"):
        registry.get("cosmoflow").config_path("medium")


def test_unknown_benchmark_lists_known() -> None:
    with pytest.raises(ConfigError, match="no benchmark 'cosmo'; known: aiperf, cosmoflow"):
        registry.get("cosmo")


def test_batch_must_split_over_ranks(cosmo_cfg) -> None:
    cfg = cosmo_cfg("loop.global_batch_size=10")
    assert cfg.loop.local_batch_size(2) == 5
    with pytest.raises(ConfigError, match="not divisible by world_size x gradient_accumulation_steps=4"):
        cfg.loop.local_batch_size(4)


def test_parse_overrides_uses_yaml_scalars() -> None:
    assert parse_overrides(["a.b=0.5", "c=[1, 2]", "d=false", "e=text"]) == {
        "a.b": 0.5,
        "c": [1, 2],
        "d": False,
        "e": "text",
    }
