"""Which node-local directory staging writes to."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

LOCAL_DIR_VARIABLE = "MLHPC_LOCAL_DIR"
# Node-local scratch that schedulers and sites export, in order of preference.
_SCHEDULER_VARIABLES = ("SLURM_TMPDIR", "LOCAL_SCRATCH", "TMPDIR")


def resolve_local_dir(
    flag: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """The flag, else $MLHPC_LOCAL_DIR, else the scheduler's node-local temp dir, else the system temp dir."""
    env = os.environ if env is None else env
    if flag:
        return Path(flag)
    for name in (LOCAL_DIR_VARIABLE, *_SCHEDULER_VARIABLES):
        if env.get(name):
            return Path(env[name])
    return Path(tempfile.gettempdir())
