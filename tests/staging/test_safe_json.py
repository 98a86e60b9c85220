"""`common.safeio.safe_json`: any text, however deep or however large its numbers, parses or raises
BadJson with a reason; never RecursionError, never inf or NaN, never a hang on a FIFO."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.safeio.safe_json import MAX_DEPTH, BadJson, load_file, loads
from mlhpc.common.safeio.safe_read import RefusedFile


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"a":' * 5_000 + "1" + "}" * 5_000, "nested"),
        ('{"x": 1e400}', "out of range"),
        ('{"x": -1e400}', "out of range"),
        ('{"x": NaN}', "not a number"),
        ('{"x": Infinity}', "not a number"),
        ("{", "not valid JSON"),
        ('{"x": ' + "9" * 5000 + "}", "digits"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_hostile_json_is_one_reason(text: str | bytes, why: str) -> None:
    with pytest.raises(BadJson, match=why):
        loads(text)


def test_expected_top_level_type() -> None:
    assert loads('{"a": [1, 2.5]}', dict) == {"a": [1, 2.5]}
    with pytest.raises(BadJson, match="JSON list where a dict belongs"):
        loads("[1]", dict)


def test_brackets_inside_strings_do_not_count() -> None:
    assert loads(json.dumps({"k": "[" * 1000})) == {"k": "[" * 1000}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_what_json_writes_reads_back(value: object) -> None:
    assert loads(json.dumps(value)) == value


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\:,0123456789.eE+-aNIfinty ', max_size=300), st.integers(1, 200))
def test_any_text_parses_or_is_refused_with_a_reason(text: str, depth: int) -> None:
    try:
        loads("[" * depth + text + "]" * depth)
    except BadJson as e:
        assert str(e)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "owner.json"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFile, match="not a regular file"):
        load_file(fifo)
    assert MAX_DEPTH >= 8


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_shown_names_are_one_visible_line(name: str) -> None:
    from mlhpc.common.printable import shown

    text = shown(name)
    assert "\x1b" not in text and "\r" not in text and "\n" not in text and "\u202e" not in text
    assert len(text.splitlines() or [""]) == 1
    if name.isprintable():
        assert text == name
