"""`mlhpc run --io ... --durable` reaches staging: the flags, RunOptions, and the staging call
(its choice then lands in staging_stop's metadata)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlhpc.campaign import local as runner
from mlhpc.campaign.options import from_args
from mlhpc.cli import build_parser
from mlhpc.staging import CallbackComm
from mlhpc.staging.manifest import MANIFEST_NAME, build_manifest


def test_run_takes_io_and_durable_into_its_options() -> None:
    args = build_parser("run").parse_args(["run", "cosmoflow", "--out", "o", "--io", "buffered", "--durable"])
    opts = from_args(args)
    assert (opts.staging_io, opts.durable) == ("buffered", True)
    plain = from_args(build_parser("run").parse_args(["run", "cosmoflow", "--out", "o"]))
    assert (plain.staging_io, plain.durable) == ("auto", False)
    with pytest.raises(SystemExit):
        build_parser("run").parse_args(["run", "cosmoflow", "--out", "o", "--io", "fast"])


@pytest.mark.parametrize(("io", "label"), [("buffered", "buffered"), ("auto", "buffered")])
def test_the_run_stages_with_its_io_and_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str, label: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    build_manifest(src).write(src / MANIFEST_NAME)
    synced: list[Path] = []
    monkeypatch.setattr("mlhpc.staging.destination.sync_filesystem", synced.append)
    opts = runner.RunOptions(benchmark="toy", out=tmp_path / "out", staging_io=io, durable=True)
    staged = runner._stage(src, tmp_path / "dest", SimpleNamespace(is_main=False), CallbackComm(), opts)
    assert staged.metadata["staging_io"] == label and staged.metadata["staging_durable"] is True
    assert synced == [tmp_path / "dest"] and (tmp_path / "dest" / "f2.bin").stat().st_size == 1002
