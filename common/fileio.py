"""Write-then-rename helpers: a reader never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`atomic_write_bytes` of `text` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write `data` as indented JSON with `atomic_write_text`."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
