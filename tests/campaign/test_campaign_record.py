"""The campaign record (`<out>/campaign.json`) is written once per campaign (issue 31): the first
writer's first seed wins, a later run with another is refused before training, and nothing a
resume cannot run (seeds, indices, model sizes, a file or archive as --data, --out inside --data)
is ever recorded; a hostile or newer campaign file is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.campaign.io import check_data_path, given_settings, read_campaign_file
from mlhpc.campaign.plan import (
    CAMPAIGN_FILE,
    CAMPAIGN_FORMAT,
    CampaignFile,
    Entry,
    ResultScan,
    Settings,
)
from mlhpc.campaign.seeds import MAX_RUNS, MAX_SEED, check_numbers
from mlhpc.common.errors import ConfigError, MlhpcError, SubmissionError
from tests.helpers.campaign_plans import OUT, plan, recorded, request
from tests.helpers.cli import cli_env, mlhpc_cli

INDEX_RUN = {"num_runs": 1, "settings": {"system": "sys_n4"}}
"""What these tests ask by default: one run (an `--index` run of a campaign), the system given."""

# ---------------------------------------------------------------------------------------------
# The first writer's first seed wins


def test_another_first_seed_is_refused_while_the_first_run_is_unfinished() -> None:
    """The race of issue 31: --index 0 --first-seed 100 recorded, still training (nothing finished);
    --index 1 --first-seed 9 was accepted and rewrote the record."""
    for changes in ({"index": 1}, {"index": 0, "resume": True}, {"resume": True, "num_runs": 3}):
        with pytest.raises(ConfigError) as refused:
            plan(request(**{**INDEX_RUN, "first_seed": 9, **changes}), recorded())
        message = str(refused.value)
        assert "first seed 100" in message and "--first-seed 9" in message and "\n" not in message
        assert "drop --first-seed" in message and "--first-seed 100" in message


def test_a_run_without_a_first_seed_follows_the_recorded_one() -> None:
    p = plan(request(**INDEX_RUN, index=1), recorded())
    assert p.seeds[1] == 101 and p.record == recorded()  # nothing in the record changes
    assert plan(request(**INDEX_RUN, index=2, first_seed=100), recorded()).seeds[2] == 102  # the same one: fine


def test_results_that_disagree_with_the_record_are_one_line_not_a_wrong_fix() -> None:
    """What the old race left: campaign.json says 9, result_0.txt ran 100."""
    scan = ResultScan(present=frozenset({0}), finished={0: 100}, folder=OUT / "r")
    with pytest.raises(SubmissionError) as refused:
        plan(request(**INDEX_RUN, index=1), recorded(first_seed=9), scan)
    message = str(refused.value)
    assert "records first seed 9" in message and "ran seed 100" in message and "\n" not in message


def test_a_planted_result_with_a_huge_seed_is_refused_before_anything_is_recorded() -> None:
    scan = ResultScan(present=frozenset({0}), finished={0: 2**70}, folder=OUT / "r")
    with pytest.raises(SubmissionError, match="move those results away"):
        plan(request(**INDEX_RUN, index=1), None, scan)


@st.composite
def records(draw: st.DrawFn) -> CampaignFile | None:
    if draw(st.booleans()):
        return None
    seeds = draw(st.integers(1, 6))
    first = draw(st.integers(1, 1000))
    system = draw(st.sampled_from([None, "sys_n4"]))
    settings_ = Settings(submitter="org", system=system, division="closed", status="onprem", ruleset="3.0.0")
    entry = Entry(
        config="mini", config_id=draw(st.sampled_from(["aaaa", "bbbb"])), num_runs=seeds, first_seed=first
    )
    hardware = draw(st.sampled_from([None, "hw_n4"]))
    return CampaignFile(settings=settings_, entries={"cosmoflow/strong": entry}, hardware=hardware)


@settings(max_examples=200, deadline=None)
@given(
    record=records(),
    first_seed=st.none() | st.integers(-5, 1000) | st.sampled_from([2**32, 2**64, MAX_SEED]),
    index=st.none() | st.integers(-2, 9) | st.just(10**9),
    resume=st.booleans(),
    seeds=st.integers(0, 6),
    system=st.sampled_from([None, "sys_n4", "other_n4"]),
    hardware=st.sampled_from([None, "hw_n4", "hw_n8"]),
)
def test_a_plan_only_adds_to_the_record(
    record: CampaignFile | None,
    first_seed: int | None,
    index: int | None,
    resume: bool,
    seeds: int,
    system: str | None,
    hardware: str | None,
) -> None:
    """Whatever a later run asks, the record it leaves keeps every recorded value (first seed,
    config, settings, hardware) or the plan is refused in one line; every planned seed is one
    torch and NumPy take."""
    req = request(
        first_seed=first_seed,
        index=index,
        resume=resume,
        num_runs=seeds,
        settings={"system": system} if system else {},
        default_system=hardware,
    )
    try:
        p = plan(req, record)
    except MlhpcError as refused:
        assert "\n" not in str(refused)
        return
    assert all(1 <= seed <= MAX_SEED for seed in p.seeds) and len(p.seeds) <= MAX_RUNS
    if record is None:
        return
    old, new = record.entries["cosmoflow/strong"], p.record.entries["cosmoflow/strong"]
    assert (new.first_seed, new.config_id, new.config) == (old.first_seed, old.config_id, old.config)
    assert new.num_runs >= old.num_runs and p.seeds[0] == old.first_seed
    for name, value in vars(record.settings).items():
        assert value is None or getattr(p.record.settings, name) == value
    assert record.hardware in (None, p.record.hardware)


# ---------------------------------------------------------------------------------------------
# Seeds and indices: bounded where they are parsed and planned


@settings(max_examples=200, deadline=None)
@given(
    seeds=st.integers(-3, MAX_RUNS + 3) | st.integers(),
    first_seed=st.none() | st.integers(-3, 2**66) | st.sampled_from([MAX_SEED, MAX_SEED - 1, 2**64]),
    index=st.none() | st.integers(-3, MAX_RUNS + 3) | st.sampled_from([10**9, 10**30]),
)
def test_seeds_that_torch_or_numpy_refuse_are_refused_at_parse_time(
    seeds: int, first_seed: int | None, index: int | None
) -> None:
    try:
        check_numbers(num_runs=seeds, first_seed=first_seed, index=index)
    except ConfigError as refused:
        assert "\n" not in str(refused) and "pass" in str(refused)
        return
    assert 1 <= seeds <= MAX_RUNS and (index is None or 0 <= index < MAX_RUNS)
    if first_seed is not None:
        last = first_seed + max(seeds, (index or 0) + 1) - 1
        for seed in (first_seed, last):  # what seed_everything and the samplers do with it
            torch.manual_seed(seed)
            torch.Generator().manual_seed(seed + 1000)  # a sampler adds the epoch
            np.random.seed(seed)


@pytest.mark.parametrize(
    "entry",
    [
        {"num_runs": 10**9, "first_seed": 1},  # a resume would allocate a seed per run
        {"num_runs": 1, "first_seed": 2**64},  # every resume would crash in torch
        {"num_runs": 3, "first_seed": MAX_SEED - 1},  # the last seed past 2**32 - 1
        {"num_runs": True, "first_seed": 1},
    ],
)
def test_a_recorded_entry_a_resume_cannot_run_is_one_line(tmp_path: Path, entry: dict[str, object]) -> None:
    path = tmp_path / CAMPAIGN_FILE
    data = recorded().to_json()
    data["entries"]["cosmoflow/strong"].update(entry)
    path.write_text(json.dumps(data))
    with pytest.raises(SubmissionError) as refused:
        read_campaign_file(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------------------------------------
# A hostile or newer campaign file


def nested(depth: int) -> str:
    return '{"settings": ' + "[" * depth + "]" * depth + "}"


@settings(max_examples=100, deadline=None)
@given(
    text=st.one_of(
        st.integers(65, 100_000).map(nested),
        st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "9" * 5000]).map(
            lambda n: '{"mlhpc_campaign": 1, "settings": {}, "entries": {"x": {"seeds": ' + n + "}}}"
        ),
    )
)
def test_a_deep_or_out_of_range_campaign_file_is_one_line_naming_it(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("c") / CAMPAIGN_FILE
    path.write_text(text)
    for read in (read_campaign_file, lambda p: given_settings(p, {})):
        with pytest.raises(MlhpcError) as refused:
            read(path)
        message = str(refused.value)
        assert str(path) in message and "\n" not in message and ("fix it" in message or "move it" in message)


def test_a_campaign_file_of_a_newer_format_is_refused_not_downgraded(tmp_path: Path) -> None:
    path = tmp_path / CAMPAIGN_FILE
    newer = {**recorded().to_json(), "mlhpc_campaign": CAMPAIGN_FORMAT + 1, "what_it_adds": {"x": 1}}
    path.write_text(json.dumps(newer))
    before = path.read_bytes()
    for read in (read_campaign_file, lambda p: given_settings(p, {})):
        with pytest.raises(SubmissionError) as refused:
            read(path)
        assert f"written by a newer mlhpc (format {CAMPAIGN_FORMAT + 1}" in str(refused.value)
        assert "use that version or a new --out" in str(refused.value)
    for version in (None, "1", True, 0, 1.5):  # not a format number: not mlhpc's file
        path.write_text(json.dumps({**recorded().to_json(), "mlhpc_campaign": version}))
        with pytest.raises(SubmissionError, match="not an mlhpc campaign file"):
            read_campaign_file(path)
    by_hand = {key: value for key, value in recorded().to_json().items() if key != "mlhpc_campaign"}
    path.write_text(json.dumps(by_hand))
    assert read_campaign_file(path) == recorded()  # no format number: format 1, as the docs show it
    path.write_bytes(before)
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(tmp_path), "--index", "0", "--dry-run"], tmp_path)
    assert (
        proc.returncode == 2
        and f"format {CAMPAIGN_FORMAT + 1}" in proc.stderr
        and path.read_bytes() == before
    )


def test_a_format_1_campaign_file_reads_its_count_of_runs_by_its_old_name(tmp_path: Path) -> None:
    """Format 1 called an entry's count of results `seeds` (a count, not seed values); a later
    mlhpc reads it as num_runs and writes it back under the new name and format."""
    path = tmp_path / CAMPAIGN_FILE
    old = recorded(seeds=4).to_json()
    entry = old["entries"]["cosmoflow/strong"]
    entry["seeds"] = entry.pop("num_runs")
    path.write_text(json.dumps({**old, "mlhpc_campaign": 1}))
    read = read_campaign_file(path)
    assert read == recorded(seeds=4) and read is not None
    assert read.entries["cosmoflow/strong"].num_runs == 4
    written = read.to_json()
    assert written["mlhpc_campaign"] == CAMPAIGN_FORMAT == 2
    assert "seeds" not in written["entries"]["cosmoflow/strong"]
    assert written["entries"]["cosmoflow/strong"]["num_runs"] == 4


# ---------------------------------------------------------------------------------------------
# --data as a run reads it


@pytest.mark.parametrize("name", ["cosmoflow.tar", "data.tar.gz", "d.tgz", "d.tar.zst", "d.tzst"])
def test_an_archive_as_data_says_stage_it_first(tmp_path: Path, name: str) -> None:
    archive = tmp_path / name
    archive.write_bytes(b"\0" * 1024)
    with pytest.raises(MlhpcError) as refused:
        check_data_path(archive, tmp_path / "out")
    message = str(refused.value)
    assert "is an archive" in message and f"mlhpc stage {archive} DEST" in message
    assert "does not exist" not in message and "\n" not in message
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    with pytest.raises(MlhpcError, match="is a file, not a dataset folder"):
        check_data_path(plain, tmp_path / "out")


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(st.sampled_from(["a", "b", "..", "."]), min_size=0, max_size=3),
    out=st.lists(st.sampled_from(["a", "b", "..", ".", "link"]), min_size=0, max_size=4),
)
def test_out_inside_data_is_refused_by_resolved_path(
    tmp_path_factory, data: list[str], out: list[str]
) -> None:
    root = tmp_path_factory.mktemp("p") / "r" / "s"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "link").symlink_to(root / "a" / "b")
    (root / "link").symlink_to(root / "a")
    data_path, out_path = root.joinpath(*data), root.joinpath(*out)
    inside = out_path.resolve() == data_path.resolve() or data_path.resolve() in out_path.resolve().parents
    if not data_path.is_dir():
        return
    try:
        check_data_path(data_path, out_path)
    except ConfigError as refused:
        assert inside and "is inside --data" in str(refused) and "\n" not in str(refused)
        return
    assert not inside


# ---------------------------------------------------------------------------------------------
# Real runs: refused before campaign.json is written, and two racing --index runs


def no_record(out: Path) -> bool:
    return not (out / CAMPAIGN_FILE).exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--index", "1000000000"], "--index 1000000000 must be from 0 to"),
        (["--index", "0", "--first-seed", str(2**64)], f"--first-seed {2**64} must be from 1 to"),
        (["--first-seed", "0"], "--first-seed 0 must be from 1"),
        (["model.base_filters=0"], "model.base_filters=0 must be at least 1"),
        (["model.dense_units=[-3]"], "model.dense_units=-3"),
        (["model.conv_layers=40"], "builds no cosmoflow model"),
    ],
)
def test_what_a_resume_could_not_run_is_refused_before_it_is_recorded(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    proc = mlhpc_cli(
        ["run", "cosmoflow", "--out", str(out), "--system", "ci", "--no-check", *extra], tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert no_record(out)


def test_data_an_archive_or_holding_out_is_refused_before_it_is_recorded(tmp_path: Path) -> None:
    archive = tmp_path / "cosmoflow.tar"
    archive.write_bytes(b"\0" * 10240)
    out = tmp_path / "out"
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(out), "--data", str(archive), "--no-check"], tmp_path)
    assert proc.returncode == 2 and "is an archive" in proc.stderr and "mlhpc stage" in proc.stderr
    assert no_record(out)
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    inner = data / "runs"
    proc = mlhpc_cli(["run", "cosmoflow", "--out", str(inner), "--data", str(data), "--no-check"], tmp_path)
    assert proc.returncode == 2 and "is inside --data" in proc.stderr, proc.stderr
    assert no_record(inner)


# The CLI, imported before the barrier so both processes reach the plan at about the same moment.
_AT_THE_BARRIER = """
import os, sys, time
from mlhpc.cli import main
import mlhpc.campaign.local  # the heavy imports happen before the race
barrier = sys.argv[1]
while not os.path.exists(barrier):
    time.sleep(0.001)
sys.exit(main(sys.argv[2:]))
"""


def racing(args: list[str], barrier: Path, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _AT_THE_BARRIER, str(barrier), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env=cli_env(MLHPC_LOCAL_DIR=str(root / "local")),
    )


@pytest.mark.parametrize("attempt", range(3))
def test_two_racing_index_runs_agree_on_one_first_seed(
    tmp_path: Path, cosmo_data: Path, attempt: int
) -> None:
    """Two `--index` runs with different --first-seed started at once: the one that plans first
    records its seed (once its data passed: nothing is recorded before) and trains one short
    epoch; the other is refused before training, naming that seed and the fix."""
    out, barrier = tmp_path / "out", tmp_path / "go"
    seeds = {0: 500 + attempt, 1: 900 + attempt}
    short = ["data.num_train_samples=32", "data.num_eval_samples=8", "loop.max_epochs=1", "loop.target=100"]
    common = [
        "run",
        "cosmoflow",
        "--out",
        str(out),
        "--data",
        str(cosmo_data),
        "--system",
        "ci",
        "--no-check",
    ]
    procs = {
        index: racing([*common, "--index", str(index), "--first-seed", str(seed), *short], barrier, tmp_path)
        for index, seed in seeds.items()
    }
    time.sleep(0.5)
    barrier.touch()
    ended = {index: proc.communicate(timeout=600) for index, proc in procs.items()}
    record = read_campaign_file(out / CAMPAIGN_FILE)
    assert record is not None, ended
    winner = record.entries["cosmoflow/strong"].first_seed
    assert winner in seeds.values()
    for index, (_, stderr) in ended.items():
        if seeds[index] == winner:
            assert procs[index].returncode == 0, stderr  # planned, recorded, trained
        else:
            assert procs[index].returncode == 2 and stderr.count("\n") == 1, stderr
            assert f"first seed {winner}" in stderr and "drop --first-seed" in stderr, stderr
    # A later run without --first-seed follows the record; the record never changed.
    before = (out / CAMPAIGN_FILE).read_bytes()
    planned = ["run", "cosmoflow", "--out", str(out), "--index", "2", "--dry-run", *short]
    later = mlhpc_cli(planned, tmp_path)
    assert later.returncode == 0 and f"seeds [{winner + 2}]" in later.stdout, later.stderr
    assert (out / CAMPAIGN_FILE).read_bytes() == before
    assert not any(name.endswith(".tmp") for name in os.listdir(out))  # written by rename
