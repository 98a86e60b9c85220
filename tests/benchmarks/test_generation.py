"""Generating into a folder: mlhpc removes only what it can prove it wrote (issue "Trust", class 4)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.common.errors import DataError
from mlhpc.common.safeio.locks import LOCK_NAME
from mlhpc.generation import DATASET_COMPLETE, DATASET_GENERATING, generate_dataset
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest
from tests.helpers.datasets import tree

FIX = "pass a new or empty --out"


def write_two(folder: Path) -> None:
    (folder / "train").mkdir()
    (folder / "train" / "a.bin").write_bytes(b"a" * 10)
    (folder / "b.bin").write_bytes(b"b")


def test_a_new_folder_gets_data_manifest_and_the_finished_marker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    assert {f.path for f in Manifest.read(data / MANIFEST_NAME).files} == {"train/a.bin", "b.bin"}
    assert (data / DATASET_COMPLETE).is_file() and not (data / DATASET_GENERATING).exists()


def test_a_users_folder_is_refused_and_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "thesis.tex").write_text("years of work")
    with pytest.raises(DataError, match=f"{data} holds files mlhpc did not generate; {FIX}"):
        generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    assert tree(data, skip={LOCK_NAME}) == {"thesis.tex": b"years of work"}


def test_a_finished_dataset_is_reused_by_run_and_replaced_by_generate(tmp_path: Path) -> None:
    data = tmp_path / "data"
    generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    assert not generate_dataset(data, lambda folder: pytest.fail("regenerated"), reuse_complete=True, not_ours_fix=FIX)

    def write_one(folder: Path) -> None:
        (folder / "c.bin").write_bytes(b"c")

    assert generate_dataset(data, write_one, reuse_complete=False, not_ours_fix=FIX)
    assert set(tree(data, skip={LOCK_NAME})) == {"c.bin", MANIFEST_NAME, DATASET_COMPLETE}  # the old files went, as listed


def test_a_file_added_to_a_finished_dataset_stops_its_replacement_before_anything_goes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    (data / "train" / "notes.txt").write_text("mine")
    before = tree(data, skip={LOCK_NAME})
    with pytest.raises(DataError, match=r"notes.txt was not written by mlhpc generate; move it out"):
        generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    assert tree(data, skip={LOCK_NAME}) == before


def test_a_link_planted_in_a_finished_dataset_is_refused_not_followed(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    (data / "train" / "more").symlink_to(elsewhere)
    with pytest.raises(DataError, match="more was not written by mlhpc generate"):
        generate_dataset(data, write_two, reuse_complete=False, not_ours_fix=FIX)
    assert (elsewhere / "keep.txt").read_text() == "keep"


def _killed_after(files: int) -> Callable[[Path], None]:
    """A generator stopped (as by Ctrl-C) after writing `files` files."""

    def write(folder: Path) -> None:
        for i in range(files):
            (folder / f"part{i}.bin").write_bytes(b"h" * 100)
        raise KeyboardInterrupt

    return write


@pytest.mark.parametrize("files", [0, 1, 3])
def test_an_unfinished_generation_is_made_again(tmp_path: Path, files: int) -> None:
    data = tmp_path / "data"
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(data, _killed_after(files), reuse_complete=True, not_ours_fix=FIX)
    assert (data / DATASET_GENERATING).is_file() and not (data / DATASET_COMPLETE).exists()
    assert generate_dataset(data, write_two, reuse_complete=True, not_ours_fix=FIX)
    assert set(tree(data, skip={LOCK_NAME})) == {"train/a.bin", "b.bin", MANIFEST_NAME, DATASET_COMPLETE}


def test_an_unfinished_generation_beside_a_user_s_files_is_refused_untouched(tmp_path: Path) -> None:
    """What a killed generation cannot prove it wrote (a file added since, a planted marker) stays."""
    data = tmp_path / "data"
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(data, _killed_after(2), reuse_complete=True, not_ours_fix=FIX)
    (data / "notes.txt").write_text("mine")
    before = tree(data, skip={LOCK_NAME})
    with pytest.raises(DataError, match=r"cannot prove it wrote \(notes\.txt\)"):
        generate_dataset(data, write_two, reuse_complete=True, not_ours_fix=FIX)
    assert tree(data, skip={LOCK_NAME}) == before
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / DATASET_GENERATING).write_text("being generated by a killed mlhpc\n")
    (planted / "half.bin").write_bytes(b"h")
    with pytest.raises(DataError, match=r"half\.bin"):
        generate_dataset(planted, write_two, reuse_complete=True, not_ours_fix=FIX)
    assert (planted / "half.bin").read_bytes() == b"h"


def test_a_marker_that_is_not_a_regular_file_proves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious").write_text("p")
    (tmp_path / "elsewhere").write_text("being generated by mlhpc token " + "0" * 32)
    (data / DATASET_GENERATING).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DataError, match="holds files mlhpc did not generate"):
        generate_dataset(data, write_two, reuse_complete=True, not_ours_fix=FIX)
    assert (data / "precious").read_text() == "p"


def test_a_link_named_like_the_dataset_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / DATASET_GENERATING).write_text("planted\n")
    (target / "precious").write_text("p")
    (tmp_path / "data").symlink_to(target)
    with pytest.raises(DataError, match="holds files mlhpc did not generate"):
        generate_dataset(tmp_path / "data", write_two, reuse_complete=True, not_ours_fix=FIX)
    assert (target / "precious").read_text() == "p"


names = st.sampled_from(["a.bin", "train/a.bin", "b.bin", "x", "train/y", "z/w"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(generated=st.sets(names, max_size=4), added=st.sets(names, max_size=3), reuse=st.booleans())
def test_nothing_mlhpc_did_not_write_is_ever_lost(
    tmp_path_factory: pytest.TempPathFactory, generated: set[str], added: set[str], reuse: bool
) -> None:
    data = tmp_path_factory.mktemp("gen") / "data"

    def write(folder: Path) -> None:
        for name in generated:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"generated")

    generate_dataset(data, write, reuse_complete=False, not_ours_fix=FIX)
    users = {}
    for name in added - generated:
        path = data / name
        if path.parent.is_file() or path.is_dir():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"user's")
        users[name] = b"user's"
    try:
        generate_dataset(data, write, reuse_complete=reuse, not_ours_fix=FIX)
    except DataError:
        assert users  # refused only because of a file the user added
    else:
        assert not users or reuse
    assert {name: tree(data, skip={LOCK_NAME}).get(name) for name in users} == users


def test_mlhpc_generate_twice_replaces_its_own_data_and_refuses_a_users_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    argv = ["generate", "cosmoflow", "--out", str(data), "--samples", "4"]
    assert main(argv) == 0
    assert main(argv) == 0  # mlhpc's own dataset: replaced
    (data / "README.mine").write_text("mine")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mlhpc: error: ") and "README.mine" in err
    assert (data / "README.mine").read_text() == "mine"
    assert os.listdir(data)  # nothing was removed


GENERATING_ELSEWHERE = """
import sys
from pathlib import Path
from mlhpc.common.safeio.locks import folder_lock
data = Path(sys.argv[1])
with folder_lock(data, "generating a dataset", "wait"):
    (data / ".mlhpc_generating").write_text("being generated token " + "a" * 32)
    (data / (".mlhpc-generating-" + "a" * 32)).mkdir()
    (data / (".mlhpc-generating-" + "a" * 32) / "half.bin").write_bytes(b"h" * 7)
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_generation_under_way_in_another_process_is_refused_not_removed(tmp_path: Path) -> None:
    """Two generators into one folder: the second used to take the first's half-written files
    for a killed generation's and remove them under it."""
    from mlhpc.common.safeio.locks import FolderBusy
    from tests.helpers.processes import held_by_another_process

    data = tmp_path / "data"
    with held_by_another_process(GENERATING_ELSEWHERE, str(data)):
        before = tree(data, skip={LOCK_NAME})
        with pytest.raises(FolderBusy, match="generating a dataset"):
            generate_dataset(data, write_two, reuse_complete=True, not_ours_fix=FIX)
        assert tree(data, skip={LOCK_NAME}) == before and len(before) == 2
    assert generate_dataset(data, write_two, reuse_complete=True, not_ours_fix=FIX)  # then it is a killed one's
    assert set(tree(data, skip={LOCK_NAME})) == {"train/a.bin", "b.bin", MANIFEST_NAME, DATASET_COMPLETE}


GENERATING_SLOWLY = """
import sys
from pathlib import Path
from mlhpc.generation import generate_dataset

def write_when_told(folder: Path) -> None:
    print("held", flush=True)
    sys.stdin.read()
    (folder / "made-elsewhere.bin").write_bytes(b"e" * 5)

generate_dataset(Path(sys.argv[1]), write_when_told, reuse_complete=False, not_ours_fix="")
"""


def test_a_waiting_generator_reuses_the_dataset_another_process_finishes(tmp_path: Path) -> None:
    """AIPerf's nodes share one generated dataset: the node that finds another generating it waits
    (wait_s) and then reuses what that one finished, generating nothing itself."""
    import threading

    from tests.helpers.processes import held_by_another_process

    data = tmp_path / "data"
    generating = held_by_another_process(GENERATING_SLOWLY, str(data))
    generating.__enter__()
    finishing = threading.Timer(0.5, generating.__exit__, (None, None, None))
    finishing.start()
    try:
        reused = not generate_dataset(
            data, lambda folder: pytest.fail("generated again"), reuse_complete=True, not_ours_fix=FIX, wait_s=60
        )
    finally:
        finishing.join()
    assert reused
    assert set(tree(data, skip={LOCK_NAME})) == {"made-elsewhere.bin", MANIFEST_NAME, DATASET_COMPLETE}
