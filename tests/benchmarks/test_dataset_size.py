"""Nothing fills a disk by surprise (issue 30): a synthetic dataset's size is known before it is
written, compared with the free space, asked for by name above 4 GiB, and watched while written."""

from __future__ import annotations

import io
import math
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.contract import catalog
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import DataError
from mlhpc.dataset_size import dataset_bytes, human_size, parse_size
from mlhpc.generation import ASK_ABOVE_BYTES, SizeCheck, check_room, generate_dataset
from mlhpc.generation_progress import GenerationProgress, folder_bytes
from tests.helpers.cli import mlhpc_cli, one_error_line


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**17))
def test_a_size_shown_and_typed_back_covers_the_real_one(size: int) -> None:
    # --allow-size takes what the refusal shows; rounding down would refuse the user's own answer.
    assert parse_size(human_size(size).replace(" ", "")) >= size
    assert parse_size(human_size(size, round_up=False)) <= size  # free space is never overstated
    assert len(human_size(size)) <= 8


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_a_size_that_is_not_one_is_a_value_error_naming_the_form(text: str) -> None:
    try:
        value = parse_size(text)
    except ValueError as e:
        assert "9.9TB" in str(e)
    else:
        assert isinstance(value, int) and value >= 0


def test_units_decimal_and_binary() -> None:
    assert parse_size("9.9TB") == 9_900_000_000_000
    assert parse_size("4GiB") == 4 * 2**30 == ASK_ABOVE_BYTES
    assert parse_size(" 500 gb ") == 500 * 10**9
    assert parse_size("1234") == 1234
    for bad in ("", "TB", "1.2.3GB", "-1GB", "5 XB", "1iB"):
        with pytest.raises(ValueError):
            parse_size(bad)


@pytest.mark.parametrize(
    ("benchmark", "samples", "overrides"),
    [
        ("cosmoflow", 12, ()),
        ("deepcam", 6, ()),
        ("deepcam", 6, ("data.format=numpy",)),
        ("extreme_weather", 3, ("data.samples_per_file=2",)),
    ],
)
def test_the_estimate_matches_what_the_generator_writes(
    tmp_path: Path, benchmark: str, samples: int, overrides: tuple[str, ...]
) -> None:
    """Real generation, the bytes on disk against the estimate from the config alone."""
    info = catalog.info(benchmark)
    cfg = load_config(info.config_class, info.config_path("mini"), overrides)
    estimate = dataset_bytes(benchmark, cfg, samples)
    assert estimate is not None
    proc = mlhpc_cli(
        ["generate", benchmark, "--out", "d", "--samples", str(samples), *overrides], tmp_path, 300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = folder_bytes(tmp_path / "d")
    # The per-sample bytes dominate a real dataset; the fixed per-file parts are bounded guesses.
    assert written * 0.97 <= estimate <= written * 1.05 + 4 * 2**20, (written, estimate)


def test_full_configs_are_terabytes_and_a_plugin_is_unknown() -> None:
    info = catalog.info("cosmoflow")
    full = load_config(info.config_class, info.config_path("full"))
    assert human_size(dataset_bytes("cosmoflow", full)) == "9.9 TB"  # 589,824 cubes of 16 MiB
    assert dataset_bytes("someone_elses", full) is None
    check_room(None, Path("/nonexistent"), None, "x", "y")  # unknown: not checked, not refused


def test_more_than_the_disk_holds_is_refused_even_when_allowed(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(DataError) as caught:
        check_room(free * 2, tmp_path / "d", free * 3, "mlhpc generate x", "pass --samples N")
    message = str(caught.value)
    assert human_size(free * 2) in message and "free at" in message and "pass --samples N" in message
    assert not (tmp_path / "d").exists()


def test_a_large_dataset_needs_its_size_named(tmp_path: Path) -> None:
    size = ASK_ABOVE_BYTES + 10**9
    if shutil.disk_usage(tmp_path).free < size:
        pytest.skip("this disk has less than 5.3 GB free")
    with pytest.raises(DataError, match=r"pass --allow-size 5\.3GB to generate it"):
        check_room(size, tmp_path, None, "mlhpc generate x", "pass --samples N")
    with pytest.raises(DataError, match=r"--allow-size 5\.0GB is less"):
        check_room(size, tmp_path, 5 * 10**9, "mlhpc generate x", "pass --samples N")
    check_room(size, tmp_path, parse_size("5.3GB"), "mlhpc generate x", "pass --samples N")
    check_room(ASK_ABOVE_BYTES, tmp_path, None, "mlhpc generate x", "pass --samples N")  # at the line


def test_an_old_dataset_being_replaced_gives_its_space_back(tmp_path: Path) -> None:
    """`generate` into its own finished dataset: the room counts the files it will remove."""
    data = tmp_path / "d"
    generate_dataset(
        data, lambda f: (f / "x.bin").write_bytes(b"x" * 1000), reuse_complete=False, not_ours_fix=""
    )
    free = shutil.disk_usage(tmp_path).free
    # Slightly more than the free space: fits only with the old dataset's 1,000 bytes back.
    size = SizeCheck(expected=free + 500, allow=free * 2, what="mlhpc generate x", fix="pass --samples N")
    written = []
    try:
        generate_dataset(data, lambda f: written.append(f), reuse_complete=False, not_ours_fix="", size=size)
    except DataError as e:  # another process on this disk took the margin meanwhile
        assert "free" in str(e)
    else:
        assert [folder.parent for folder in written] == [data]  # its work folder inside d


def test_the_full_run_without_data_is_refused_fast_before_anything_is_written(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = mlhpc_cli(["run", "cosmoflow", "--config", "full", "--seeds", "1", "--out", "X"], tmp_path, 120)
    elapsed = time.monotonic() - started
    line = one_error_line(proc, "9.9 TB", "free at", "X/datasets/cosmoflow-full", "--data")
    assert not (tmp_path / "X").exists(), line
    assert elapsed < 30, elapsed  # no torch import, no lock, no plan: a config read and a statfs
    dry = mlhpc_cli(["run", "cosmoflow", "--config", "full", "--out", "X", "--dry-run"], tmp_path, 120)
    # The dry run touches no data: it says what a run without --data would refuse (issue 40).
    assert dry.returncode == 0 and "a run without --data here would refuse" in dry.stdout, dry.stderr
    assert "9.9 TB" in dry.stdout and not (tmp_path / "X").exists()


def test_the_dry_run_says_how_big_and_where(tmp_path: Path) -> None:
    proc = mlhpc_cli(["run", "cosmoflow", "--out", "runs", "--dry-run"], tmp_path, 300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "a synthetic dataset of about 43.0 MB generated into runs/datasets/cosmoflow-mini" in summary
    assert "free there" in summary
    assert not (tmp_path / "runs").exists()


def test_generate_asks_for_the_size_of_a_large_dataset(tmp_path: Path) -> None:
    # 300 full-size cubes and 38 to validate are 5.7 GB: over the line, refused unless --allow-size names it.
    if shutil.disk_usage(tmp_path).free < 6 * 10**9:
        pytest.skip("this disk has less than 6 GB free")
    proc = mlhpc_cli(
        ["generate", "cosmoflow", "--config", "full", "--samples", "300", "--out", "d"], tmp_path
    )
    line = one_error_line(proc, "--allow-size", "GB", "free at", "--samples N")
    assert not (tmp_path / "d").exists(), line
    proc = mlhpc_cli(
        [
            "generate",
            "cosmoflow",
            "--config",
            "full",
            "--samples",
            "300",
            "--out",
            "d",
            "--allow-size",
            "1GB",
        ],
        tmp_path,
    )
    one_error_line(proc, "--allow-size 1.0GB is less")
    proc = mlhpc_cli(["generate", "cosmoflow", "--out", "d", "--allow-size", "lots"], tmp_path)
    assert proc.returncode == 2 and "9.9TB" in proc.stderr


def test_progress_lines_while_a_slow_generation_writes(tmp_path: Path) -> None:
    """A real watcher thread over a real folder that grows: lines with the share and time left."""
    stream = io.StringIO()
    folder = tmp_path / "d"
    folder.mkdir()
    watcher = GenerationProgress(folder, expected=4000, stream=stream)
    watcher.QUIET_S, watcher.PLAIN_EVERY_S = 0.05, 0.05
    with watcher:
        for i in range(4):
            (folder / f"{i}.bin").write_bytes(b"x" * 1000)
            time.sleep(0.15)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert all(line.startswith("generating: ") and "of about 4.0 KB" in line for line in lines)
    assert any("left" in line for line in lines)
    assert lines[-1].split("(")[1].startswith(("75 %", "100 %")), lines


def test_a_quick_generation_prints_nothing(tmp_path: Path) -> None:
    stream = io.StringIO()
    with GenerationProgress(tmp_path, expected=10, stream=stream):
        pass
    assert stream.getvalue() == ""
    assert not [t for t in threading.enumerate() if t.name == "mlhpc-generation-progress"]
    assert math.isclose(folder_bytes(tmp_path), 0)


def test_a_slurm_campaign_passes_the_allowed_size_to_its_data_job(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 6 * 10**9:
        pytest.skip("this disk has less than 6 GB free")
    words = ["run", "cosmoflow", "--config", "full", "--out", "X", "--slurm", "--dry-run"]
    words += ["data.num_train_samples=300", "data.num_eval_samples=38"]  # 5.7 GB
    one_error_line(mlhpc_cli(words, tmp_path, 120), "--allow-size 5.7GB")  # refused on the login node
    proc = mlhpc_cli([*words, "--allow-size", "5.7GB"], tmp_path, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    generate = next(line for line in proc.stdout.splitlines() if " generate cosmoflow " in line)
    assert "--allow-size 5700000000" in generate  # or the data job would refuse what was allowed
    assert not (tmp_path / "X").exists()
