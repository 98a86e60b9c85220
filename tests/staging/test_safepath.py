"""The one path judge: relative paths, link targets, where a write really lands."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.errors import MlhpcError, StagingError
from mlhpc.common.safeio.safepath import inside, landing, link_target, relative_path

WHERE, FIX = "src.tar: member", "rebuild it"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a/b.npy", "a/b.npy"), ("./a//b/./c", "a/b/c"), ("a/", "a"), ("a..b/..c", "a..b/..c"), ("C", "C")],
)
def test_relative_paths_are_normalised(name: str, expected: str) -> None:
    assert relative_path(name, WHERE, FIX) == expected


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../outside.txt", "climbs out with '..'"),
        ("a/../../b", "climbs out with '..'"),
        ("a/..", "climbs out with '..'"),
        ("/etc/passwd", "has an absolute path"),
        ("//server/share", "has an absolute path"),
        ("C:/Windows/x", "has an absolute path"),
        ("c:x", "has an absolute path"),
        ("a\\..\\..\\b", "contains a backslash"),
        ("a\0b", "contains a NUL byte"),
        ("", "is empty"),
        ("./.", "is empty"),
    ],
)
def test_unsafe_names_are_refused_naming_source_and_fix(name: str, problem: str) -> None:
    with pytest.raises(StagingError) as caught:
        relative_path(name, WHERE, FIX)
    message = str(caught.value)
    assert message.startswith(f"{WHERE} {name!r} {problem}") and message.endswith(f"; refused: {FIX}")
    assert "\n" not in message and isinstance(caught.value, MlhpcError)


def test_the_root_itself_only_where_allowed() -> None:
    assert relative_path("./", WHERE, FIX, root_ok=True) == ""
    with pytest.raises(StagingError, match="is empty"):
        relative_path("./", WHERE, FIX)


def test_non_strings_are_refused() -> None:
    with pytest.raises(StagingError, match="is not a string"):
        relative_path(7, WHERE, FIX)  # type: ignore[arg-type]


@pytest.mark.parametrize("target", ["", "/etc/passwd", "a\0b", "..\\..\\x", "D:/x"])
def test_link_targets_must_be_relative_text(target: str) -> None:
    with pytest.raises(StagingError, match=r"links to .*; refused: rebuild it"):
        link_target(target, WHERE, FIX)


def test_link_targets_may_climb_as_text() -> None:
    assert link_target("../v2/data", WHERE, FIX) == "../v2/data"


def test_inside_follows_links_on_the_real_tree(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    (root / "a").mkdir(parents=True)
    os.symlink("..", root / "a" / "up")
    real = os.path.realpath(root)
    assert inside(str(root / "a" / "up"), real)  # DEST itself
    assert not inside(str(root / "a" / "up" / ".."), real)
    assert inside(str(root / "a" / "missing" / ".." / "b"), real)
    assert not inside(str(tmp_path / "dest-sibling"), real)  # a shared prefix is not inside


def test_landing_refuses_a_symlinked_directory_on_the_way(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    (root / "real" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "real" / "jump")
    assert landing(str(root), "real/deep/f", WHERE, FIX) == str(root / "real" / "deep" / "f")
    assert landing(str(root), "new/dir/f", WHERE, FIX) == str(root / "new" / "dir" / "f")
    assert landing(str(root), "real/jump", WHERE, FIX) == str(root / "real" / "jump")  # the last is ours
    with pytest.raises(StagingError, match=r"'real/jump/f' goes through the symlink 'real/jump'"):
        landing(str(root), "real/jump/f", WHERE, FIX)
    (root / "file").write_bytes(b"")
    with pytest.raises(StagingError, match="which is not a directory"):
        landing(str(root), "file/f", WHERE, FIX)


def test_landing_remembers_checked_directories(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    (root / "a" / "b").mkdir(parents=True)
    known: set[str] = set()
    landing(str(root), "a/b/f", WHERE, FIX, known)
    assert known == {"a", "a/b"}
    landing(str(root), "a/b/g", WHERE, FIX, known)  # no lstat needed: a/b is known


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(["a", "b.c", "/", ".", "..", ".h", "\\", "\0", ":", "C", "é"]), max_size=8))
def test_property_a_judged_path_stays_under_its_root(pieces: list[str]) -> None:
    """Any text: refused with a StagingError, or a normalised path with no way out of a root
    (and the quick path for plain names agrees with the long one)."""
    name = "".join(pieces)
    try:
        rel = relative_path(name, WHERE, FIX, root_ok=True)
    except StagingError:
        return
    parts = rel.split("/") if rel else []
    assert all(p not in ("", ".", "..") for p in parts)
    assert "\0" not in rel and "\\" not in rel and not rel.startswith("/")
    assert rel == ("" if posixpath.normpath(name) == "." else posixpath.normpath(name))
    root = "/r/o/o/t"
    assert posixpath.normpath(posixpath.join(root, rel)).startswith(root)
