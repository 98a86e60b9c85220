"""Calling vcluster from outside the cluster (the tests' fixture, perf/cluster_staging.py): the
tool's path, one run of it, the `--see` arguments for folders in the host's /tmp that the
nodes must keep seeing (each node has its own /tmp), and a node's processes killed."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VCLUSTER = Path(__file__).resolve().parents[1] / "vcluster"


def run_vcluster(*args: str, timeout: float = 90, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`scripts/vcluster ARGS` on its own python (its shebang), its output captured, never checked."""
    return subprocess.run(
        [str(VCLUSTER), *args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def seen_by_nodes(paths: Iterable[Path]) -> list[str]:
    """`--see DIR` for each of `paths` that lies inside the host's /tmp, the outermost only."""
    tmp = Path("/tmp").resolve()
    inside = {p.resolve() for p in paths if tmp in p.resolve().parents}
    return [a for p in sorted(inside) if not any(q in p.parents for q in inside) for a in ("--see", str(p))]


def kill_on_node(node: str, needle: bytes) -> list[int]:
    """SIGKILL the processes Slurm started on `node` (SLURMD_NODENAME in their environment) whose
    command line has a word containing `needle`: a node lost mid-run, for the fault tests. The
    hosts share this machine's process table, so `pkill` on a node would reach every host's."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={node}".encode() in environ and any(needle in word for word in argv):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(int(entry))
    return killed
