"""JSON that another program or another user wrote, parsed without a traceback: bounded in size
and nesting, finite numbers only, and of the type the caller expects.

`json.loads` recurses once per level of nesting, so `[[[[…]]]]` a few thousand deep raises
RecursionError; `1e400` becomes `inf` and `NaN` is accepted. Every reader of a manifest, journal,
campaign file, systems JSON or a neighbour's owner file goes through `loads` here and turns
`BadJson` into one line naming the file. Torch-free.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

from mlhpc.common.safeio.safe_read import read_bytes

MAX_DEPTH = 64
"""Deeper than any file mlhpc writes (they nest 4 levels at most)."""

T = TypeVar("T")


class BadJson(ValueError):
    """The text is not JSON mlhpc accepts; the message says why, without the file's name."""


def _nesting(text: str) -> int:
    """The deepest bracket nesting outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJson(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise BadJson(f"{name} is not a number JSON allows")


def loads(text: str | bytes, expect: type[T] | None = None, *, max_depth: int = MAX_DEPTH) -> T | Any:
    """Parse `text`; BadJson when it is not JSON, nests deeper than `max_depth`, holds a
    non-finite number, or its top level is not of type `expect` (e.g. dict)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadJson(f"not UTF-8 text (byte {e.start})") from None
    if _nesting(text) > max_depth:
        raise BadJson(f"nested more than {max_depth} levels deep")
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadJson(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:  # a guard behind the scan: a smaller stack than expected
        raise BadJson(f"nested more than {max_depth} levels deep") from None
    except ValueError as e:  # int() of a number with more than 4,300 digits
        raise BadJson(str(e)[:120]) from None
    if expect is not None and not isinstance(value, expect):
        raise BadJson(f"holds a JSON {type(value).__name__} where a {expect.__name__} belongs")
    return value


def load_file(
    path: Path | str, expect: type[T] | None = None, *, max_bytes: int = 64 * 2**20, max_depth: int = MAX_DEPTH
) -> T | Any:
    """`loads` of a regular file of at most `max_bytes` (never a FIFO or a device: those are
    refused by `safe_read` without blocking); OSError or BadJson otherwise."""
    return loads(read_bytes(path, max_bytes, what="a JSON file"), expect, max_depth=max_depth)
