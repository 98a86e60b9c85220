"""Paths read from a manifest, a journal or a file listing never lead staging out of SRC or DEST."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from mlhpc.common.errors import StagingError
from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, StageRequest, build_manifest, stage_dataset
from mlhpc.staging.journal import JOURNAL_PREFIX, read_journals
from mlhpc.staging.manifest import Manifest, hash_file, list_dataset_files, scan_dataset
from tests.helpers.datasets import tree


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """tmp_path/box: a dataset `src` with one file, a secret beside it, and room for `dest`."""
    box = tmp_path / "box"
    (box / "src").mkdir(parents=True)
    (box / "src" / "a.bin").write_bytes(b"a" * 100)
    (box / "outside.txt").write_bytes(b"secret beside SRC")
    return box


def write_manifest(src: Path, paths: list[str], extra: dict[str, str] | None = None) -> None:
    files = [{"path": "a.bin", "size": 100, "checksum": hash_file(src / "a.bin")}]
    files += [{"path": p, "size": 17, "checksum": "0" * 32} for p in paths]
    (src / MANIFEST_NAME).write_text(json.dumps({"algorithm": "xxh3_128", "files": files, **(extra or {})}))


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("../outside.txt", "climbs out with '..'"),
        ("sub/../../outside.txt", "climbs out with '..'"),
        ("ABSOLUTE", "has an absolute path"),
        ("C:/outside.txt", "has an absolute path"),
        ("a.bin\0../../outside.txt", "contains a NUL byte"),
        ("..\\outside.txt", "contains a backslash"),
        ("", "is empty"),
    ],
)
def test_manifest_entry_outside_src_is_refused(box: Path, entry: str, problem: str) -> None:
    entry = str(box / "outside.txt") if entry == "ABSOLUTE" else entry
    write_manifest(box / "src", [entry])
    before = tree(box)
    with pytest.raises(StagingError) as caught:
        stage_dataset(StageRequest(box / "src", box / "dest", workers=2))
    message = str(caught.value)
    assert f"{box / 'src' / MANIFEST_NAME}: manifest entry {entry!r} {problem}" in message
    assert message.endswith("(mlhpc manifest SRC)") and "\n" not in message
    assert {k: v for k, v in tree(box).items() if not k.startswith("dest")} == before
    assert not (box / "dest" / STAGED_MARKER).exists()


def test_manifest_paths_are_judged_where_parsed(tmp_path: Path) -> None:
    """Every consumer gets its manifest from `from_json`: a path, a size, a repeat are judged there."""
    source = tmp_path / "m.json"

    def parse(*files: dict[str, object]) -> Manifest:
        return Manifest.from_json({"algorithm": "xxh3_128", "files": list(files)}, source)

    assert parse({"path": "./x//y", "size": 1, "checksum": ""}).files[0].path == "x/y"
    with pytest.raises(StagingError, match=r"manifest entry '/x' has an absolute path"):
        parse({"path": "/x", "size": 1, "checksum": ""})
    with pytest.raises(StagingError, match=r"malformed manifest \(path 7 is not a string\)"):
        parse({"path": 7, "size": 1, "checksum": ""})
    with pytest.raises(StagingError, match=r"malformed manifest \('x' has a negative size\)"):
        parse({"path": "x", "size": -1, "checksum": ""})
    with pytest.raises(StagingError, match=r"manifest lists 'x/y' twice"):
        parse({"path": "x/y", "size": 1, "checksum": ""}, {"path": "x/./y", "size": 1, "checksum": ""})


def test_outside_manifest_entry_is_one_cli_line(
    box: Path, run_mlhpc: Callable[..., CompletedProcess]
) -> None:
    write_manifest(box / "src", ["../outside.txt"])
    result = run_mlhpc(["stage", str(box / "src"), str(box / "dest")], timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("mlhpc: error: ") and result.stderr.count("\n") == 1
    assert "'../outside.txt' climbs out with '..'" in result.stderr and "Traceback" not in result.stderr
    assert not (box / "dest" / "outside.txt").exists() and not (box / "dest" / STAGED_MARKER).exists()


def journal_lines(dest: Path, *records: object) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{JOURNAL_PREFIX}999.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_journal_records_leaving_dest_are_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dest = tmp_path / "dest"
    good = ["a.bin", 3, "c", "a.bin", "c"]
    journal = journal_lines(
        dest,
        good,
        ["../escape.bin", 3, "c", "b.bin", "c"],
        ["b2.bin", 3, "c", "/etc/passwd", "c"],
        ["c.bin", 3, "c", "c\\..\\..\\x", "c"],
        ["d.bin", "3", "c", "d.bin", "c"],  # a size that is not a number
        {"path": "e.bin"},  # not a record at all (its whole file parses as one JSON list)
    )
    with caplog.at_level(logging.WARNING, logger="mlhpc.staging.journal"):
        found = read_journals(dest)
    assert list(found) == ["a.bin"] and list(found["a.bin"].__dict__.values()) == [*good, ""]  # no origin
    assert f"{journal}: record '../escape.bin' climbs out with '..'" in caplog.text
    assert "'/etc/passwd' has an absolute path" in caplog.text


def test_journal_line_cut_short_and_escaping_keeps_the_good_ones(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    journal = journal_lines(dest, ["a.bin", 3, "c", "a.bin", "c"], ["x", 1, "c", "../../x", "c"])
    with open(journal, "a") as handle:
        handle.write('["cut", 3, "c", "cu')  # a process killed mid-line
    assert list(read_journals(dest)) == ["a.bin"]


def test_rerun_over_a_tampered_destination_stays_inside(box: Path) -> None:
    """An earlier run's journal and manifest in DEST that name paths outside it only mean that
    nothing is skipped: the rerun copies again and writes its own manifest."""
    src, dest = box / "src", box / "dest"
    build_manifest(src).write(src / MANIFEST_NAME)
    stage_dataset(StageRequest(src, dest, workers=2))
    checksum = hash_file(src / "a.bin")
    journal_lines(dest, ["../outside.txt", 100, checksum, "a.bin", checksum])
    (dest / MANIFEST_NAME).write_text(
        json.dumps(
            {"algorithm": "xxh3_128", "files": [{"path": "../outside.txt", "size": 17, "checksum": "0"}]}
        )
    )
    (dest / STAGED_MARKER).unlink()
    before = (box / "outside.txt").read_bytes()
    report = stage_dataset(StageRequest(src, dest, workers=2))
    assert report.files == 1 and (box / "outside.txt").read_bytes() == before
    assert [f.path for f in Manifest.read(dest / MANIFEST_NAME).files] == ["a.bin"]


def test_file_listing_stays_under_the_root(box: Path) -> None:
    """A directory source without a manifest: a symlinked directory is not entered, so nothing
    outside SRC is listed, read or staged through it."""
    src = box / "src"
    (box / "elsewhere").mkdir()
    (box / "elsewhere" / "private.bin").write_bytes(b"not the dataset's")
    os.symlink(box / "elsewhere", src / "jump")
    os.symlink("..", src / "up")
    assert list_dataset_files(src) == ["a.bin"]
    assert [f.path for f in scan_dataset(src).files] == ["a.bin"]
    report = stage_dataset(StageRequest(src, box / "dest", workers=2))
    staged = [name for name in tree(box / "dest") if not name.startswith(".")]
    assert report.files == 1 and sorted(staged) == ["a.bin", MANIFEST_NAME]


def test_file_listing_refuses_a_name_no_manifest_could_hold(box: Path) -> None:
    (box / "src" / "odd\\name.bin").write_bytes(b"x")
    with pytest.raises(StagingError, match=r"src: file 'odd\\\\name.bin' contains a backslash"):
        list_dataset_files(box / "src")
