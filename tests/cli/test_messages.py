"""The messages a first hour meets (issue 30): each blames what was really wrong and names a fix
that exists; a failed command leaves no empty debug log behind."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.contract import catalog
from mlhpc.common.contract.config import load_config
from mlhpc.common.display.debug_log import debug_log
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import mlhpc_cli, one_error_line

COSMOFLOW = catalog.info("cosmoflow")


def load(*overrides: str) -> object:
    return load_config(COSMOFLOW.config_class, COSMOFLOW.config_path("mini"), overrides)


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("loop.max_epochz=3", ("no config key 'loop.max_epochz'", "did you mean loop.max_epochs?")),
        ("lop.max_epochs=3", ("no config key 'lop'", "did you mean loop?", "known sections: data, loop")),
        ("loop.max_epochs=x", ("loop.max_epochs='x' has the wrong type",)),
        ("data.num_workers=-1", ("data.num_workers=-1 must be from 0",)),
        ("loop.max_epochs.x=1", ("loop.max_epochs is a value, not a section",)),
        ("data.loader=foo", ("use one of 'auto', 'torch', 'dali'",)),
    ],
)
def test_a_bad_override_is_blamed_on_the_command_line_not_the_yaml(
    override: str, needles: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(override)
    message = str(caught.value)
    assert message.startswith(f"override {override!r} on the command line: "), message
    assert "mini.yaml" not in message
    for needle in needles:
        assert needle in message, message


def test_a_bad_yaml_key_is_still_blamed_on_the_yaml(tmp_path: Path) -> None:
    text = COSMOFLOW.config_path("mini").read_text().replace("max_epochs:", "max_epochz:")
    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"mine\.yaml: unknown config key 'loop\.max_epochz'; did you mean"):
        load_config(COSMOFLOW.config_class, tmp_path / "mine.yaml")


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z_]{1,12}(\.[a-z_]{1,12}){0,2}", fullmatch=True), st.integers())
def test_any_override_key_is_accepted_or_blamed_on_itself(key: str, value: int) -> None:
    item = f"{key}={value}"
    try:
        load(item)
    except ConfigError as e:
        assert str(e).startswith(f"override {item!r} on the command line"), str(e)


def test_stage_from_a_missing_source_names_stage_own_argument(tmp_path: Path) -> None:
    proc = mlhpc_cli(["stage", "/nonexistent", "DEST"], tmp_path, 120)
    line = one_error_line(proc, "/nonexistent does not exist", "SRC")
    assert "--data" not in line  # stage has no --data
    assert not (tmp_path / "DEST").exists()


def test_a_run_refused_at_once_leaves_no_debug_log(tmp_path: Path) -> None:
    """A command that fails before logging anything leaves no logs/ folder, nor an --out it made."""
    proc = mlhpc_cli(["run", "cosmoflow", "--out", "runs", "--data", "nowhere", "--no-check"], tmp_path, 300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not list(tmp_path.glob("runs/logs/*.log"))
    assert not (tmp_path / "runs" / "logs").exists()


def test_the_debug_log_is_made_by_its_first_record_only(tmp_path: Path) -> None:
    with debug_log(tmp_path / "quiet", rank=0) as path:
        assert path is not None
    assert not (tmp_path / "quiet").exists()  # made for the log, empty, removed
    (tmp_path / "kept").mkdir()
    with debug_log(tmp_path / "kept", rank=0) as path:
        pass
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "logs").exists()  # not ours: stays
    with debug_log(tmp_path / "loud", rank=0) as path, warnings.catch_warnings():
        logging.getLogger("mlhpc.test").warning("something worth reading")
    assert path is not None and "something worth reading" in path.read_text()
