"""Write-then-rename helpers: a reader never sees a half-written file.

What mlhpc writes for others to read (manifests, logs, system descriptions) gets the permission
bits a plain `open(path, "w")` would give, `0o666 & ~umask`, not `mkstemp`'s private 0600.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

_umask_lock = threading.Lock()


def current_umask() -> int:
    """This process's umask, read without changing it where Linux shows it (/proc/self/status,
    since 4.7): setting it to read it back is process-wide, and a thread creating a file in
    between would get the wrong mode."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:  # narrows the window among our own threads; no other way to read it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it onto `path`
    (mode `0o666 & ~umask`, like any file the user creates)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A hidden file's temporary keeps its name's start (".mlhpc_x.abc.tmp", not "..mlhpc_x..."):
    # what skips a folder's bookkeeping by prefix skips a temporary a kill left, too.
    prefix = f"{path.name}." if path.name.startswith(".") else f".{path.name}."
    fd, tmp_name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~current_umask())
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


def finite_json(data: Any) -> Any:
    """`data` with every NaN or infinity as None: strict JSON (null for undefined), which
    mlhpc's own reader (safe_json) and every other parser accept."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite_json(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(value) for value in data]
    return data


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write `data` as indented strict JSON (non-finite numbers as null) with `atomic_write_text`."""
    text = json.dumps(finite_json(data), indent=2, sort_keys=False, allow_nan=False)
    return atomic_write_text(path, text + "\n")
