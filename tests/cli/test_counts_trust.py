"""Counts and nesting from outside are bounded (issue 39): a benchmark's `data.num_workers` (one
check for all), `OMP_NUM_THREADS` and `MLHPC_THREADS`, `--allow-size`, and how deep a YAML config
or `key=value` override nests. Each is a one-line error naming the value, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.benchmarks.cosmoflow.config import CosmoFlowConfig
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig
from mlhpc.common.cluster.threads import count_bound, explicit_choice
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import MAX_YAML_DEPTH, load_config, parse_overrides
from mlhpc.common.errors import ConfigError
from mlhpc.dataset_size import MAX_SIZE_BYTES, parse_size
from tests.helpers.cli import cli_env

CONFIGS = {"cosmoflow": CosmoFlowConfig, "deepcam": DeepCamConfig, "extreme_weather": ExtremeWeatherConfig}
COUNTS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-2, max_value=count_bound() + 2),
)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), workers=COUNTS)
def test_every_benchmark_bounds_num_workers_by_the_machine(name: str, workers: int) -> None:
    path = registry.info(name).config_path("mini")
    if 0 <= workers <= count_bound():
        assert load_config(CONFIGS[name], path, [f"data.num_workers={workers}"]).data.num_workers == workers
        return
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIGS[name], path, [f"data.num_workers={workers}"])
    assert f"data.num_workers={workers}" in str(refused.value) and "set data.num_workers=4" in str(
        refused.value
    )


THREAD_TEXT = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.sampled_from(["²", "٣", "１６", "1e3", "0", "-4", "4,2", " 8 ", "9" * 400, "torch"]),
)


@settings(max_examples=300, deadline=None)
@given(variable=st.sampled_from(["OMP_NUM_THREADS", "MLHPC_THREADS"]), value=THREAD_TEXT)
def test_thread_variables_are_ascii_counts_within_the_bound(variable: str, value: str) -> None:
    text = value.strip()
    good = text.isascii() and text.isdigit() and 1 <= int(text) <= count_bound()
    if not text or (variable == "MLHPC_THREADS" and text == "torch") or good:
        choice = explicit_choice({variable: value})
        assert choice is None or choice.intra_op == (int(text) if good else 0)
        return
    with pytest.raises(ConfigError) as refused:
        explicit_choice({variable: value})
    message = str(refused.value)
    assert message.startswith(f"{variable}=") and f"from 1 to {count_bound()}" in message
    assert "\n" not in message and len(message) < 300


@settings(max_examples=200, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=30),
        st.integers(min_value=0, max_value=10**500).map(str),
        st.tuples(st.integers(0, 10**25), st.sampled_from(["", "k", "MB", "GiB", "TB", "PB", "pib"])).map(
            lambda t: f"{t[0]}{t[1]}"
        ),
    )
)
def test_a_size_is_bytes_up_to_an_exabyte_or_a_one_line_value_error(text: str) -> None:
    try:
        size = parse_size(text)
    except ValueError as e:
        assert "\n" not in str(e) and len(str(e)) < 200 and "9.9TB" in str(e)
        return
    assert 0 <= size <= MAX_SIZE_BYTES


def test_a_400_digit_allow_size_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlhpc", "run", "cosmoflow", "--out", "o", "--allow-size", "7" * 400],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "--allow-size" in proc.stderr and "is not a size" in proc.stderr


NESTINGS = {
    "list": lambda d: "[" * d + "1" + "]" * d,  # a leaf inside, as the maps have: d levels deep
    "flow map": lambda d: "{a: " * d + "1" + "}" * d,
    "block map": lambda d: "".join(f"{'  ' * i}k{i}:\n" for i in range(d)) + "  " * d + "1\n",
}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(NESTINGS)), depth=st.integers(min_value=1, max_value=3000))
def test_an_override_nested_deeper_than_the_bound_is_one_config_error(kind: str, depth: int) -> None:
    item = "loop.target=" + NESTINGS[kind](depth).replace("\n", " ") if kind != "block map" else None
    if item is None:  # a block map cannot sit on one line: the file's case below
        return
    if depth < MAX_YAML_DEPTH:
        parse_overrides([item])
        return
    with pytest.raises(ConfigError) as refused:
        parse_overrides([item])
    assert f"nests deeper than {MAX_YAML_DEPTH} levels" in str(refused.value)


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(sorted(NESTINGS)), depth=st.integers(min_value=MAX_YAML_DEPTH, max_value=3000))
def test_a_deep_config_file_is_one_config_error(
    tmp_path_factory: pytest.TempPathFactory, kind: str, depth: int
) -> None:
    path = tmp_path_factory.mktemp("deep") / "deep.yaml"
    path.write_text("loop: " + NESTINGS[kind](depth) if kind != "block map" else NESTINGS[kind](depth))
    with pytest.raises(ConfigError) as refused:
        load_config(CosmoFlowConfig, path)
    assert str(refused.value).startswith(f"config file {path} nests deeper than {MAX_YAML_DEPTH} levels")


def test_a_config_at_the_bound_still_loads_its_errors(tmp_path: Path) -> None:
    """The control: nesting just under the bound is parsed, and then refused for what it says."""
    path = tmp_path / "shallow.yaml"
    path.write_text("loop: " + NESTINGS["list"](MAX_YAML_DEPTH - 2))
    with pytest.raises(ConfigError) as refused:
        load_config(CosmoFlowConfig, path)
    assert "nests deeper" not in str(refused.value) and "required config key" in str(refused.value)
