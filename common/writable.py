"""Checking up front that a folder given on the command line can be written, so a read-only or
mistyped `--out` / `--local-dir` is one line naming it, not a traceback minutes into a run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mlhpc.common.errors import ConfigError

# Where `staging.localdir.resolve_local_dir` looks, in its order: to name the one a path came from.
LOCAL_DIR_SOURCES = ("MLHPC_LOCAL_DIR", "SLURM_TMPDIR", "LOCAL_SCRATCH", "TMPDIR")


def check_writable_dir(path: Path | str, name: str) -> Path:
    """`path` if it is a folder (or can become one) that this process can create files in, else
    a ConfigError naming `name` (e.g. "--out"), the path and the fix. Creates nothing that stays."""
    path = Path(path)
    fix = f"pass a folder you can write to as {name}"
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {path} is a file, not a folder; {fix} (or move the file away)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{name} {path}: {existing} is a file, not a folder; {fix}")
    # Try it: access() says yes to root on a read-only mount's folders and on chmod 555.
    try:
        fd, probe = tempfile.mkstemp(prefix=".mlhpc-write-test-", dir=existing)
    except OSError as e:
        raise ConfigError(
            f"{name} {path}: cannot create files in {existing} ({e.strerror or e}); {fix}"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return path


def local_dir_name(flag: Path | str | None, env: Mapping[str, str] | None = None) -> str:
    """How the user gave the node-local folder: "--local-dir", "$MLHPC_LOCAL_DIR", ..."""
    env = os.environ if env is None else env
    if flag:
        return "--local-dir"
    for variable in LOCAL_DIR_SOURCES:
        if env.get(variable):
            return f"${variable}"
    return "the system temp folder"
