"""A memory cgroup for a run under a memory limit (v1 or v2; root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from mlhpc.common.errors import StagingError


def memory_cgroup(name: str, limit_bytes: int) -> Path | None:
    """A new memory cgroup (v1 or v2) of `limit_bytes` under this process's own, or None where
    none can be made (not root, no memory controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            folder, limit = Path("/sys/fs/cgroup") / path.lstrip("/") / name, "memory.max"
        elif "memory" in controllers.split(","):
            folder, limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / name, "memory.limit_in_bytes"
        else:
            continue
        try:
            folder.mkdir()
            (folder / limit).write_text(f"{limit_bytes}\n")
            return folder
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def run_in_cgroup(group: Path, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run `command` inside `group` (its pid joins before it starts), output captured."""

    def join() -> None:
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")

    proc = subprocess.run(list(command), capture_output=True, text=True, preexec_fn=join)
    if proc.returncode:
        raise StagingError(f"{command[0]} failed in {group}: {proc.stderr.strip()[-300:]}")
    return proc


def remove_cgroup(group: Path) -> None:
    with contextlib.suppress(OSError):
        group.rmdir()
