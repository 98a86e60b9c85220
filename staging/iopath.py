"""The I/O path of a staging job, and the facts it is reported with.

There is one path, through the page cache (`engine.py`, which says why); `--io auto` and
`--io buffered` both take it. The facts still matter to whoever reads the log: how much this
node writes against the memory it may use (the machine's and its memory cgroup's) and how much
of the source the page cache holds already, which also sets the copy threads (`stage.py`: a
cached source is copied at CPU speed, so threads beyond the CPUs only queue).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.vocabulary import IO_CHOICES

CACHED_FRACTION = 0.9
"""The share of the sampled source bytes that must be in the page cache for the source to count
as cached (a dataset just generated, or staged a moment ago)."""


@dataclass(frozen=True)
class IoPlan:
    """The I/O path of one job, and the facts it was taken on."""

    reason: str
    cached: float = 0.0
    """The fraction of the sampled source bytes found in the page cache."""
    available_bytes: int | None = None
    """The memory this node may use (None: unknown)."""

    label = "buffered"

    @property
    def source_cached(self) -> bool:
        return self.cached >= CACHED_FRACTION

    def metadata(self) -> dict[str, str]:
        return {"staging_io": self.label, "staging_io_reason": self.reason}


def decide(io: str, share_bytes: int, available_bytes: int | None, cached: float) -> IoPlan:
    """The path for `io` ("auto" or "buffered": the same one), with the facts in its reason."""
    if io not in IO_CHOICES:
        raise StagingError(
            f"io={io!r} is unknown; use one of {', '.join(IO_CHOICES)} (direct and kernel were "
            "removed: measured slower than the page-cache path)"
        )
    mib = 1 << 20
    room = "unknown" if available_bytes is None else f"{available_bytes // mib} MiB"
    facts = f"share {share_bytes // mib} MiB, memory available {room}, source {cached:.0%} cached"
    return IoPlan(f"{io}: through the page cache ({facts})", cached, available_bytes)


def available_memory() -> int | None:
    """Bytes this process may fill with page cache: the machine's MemAvailable, less where a
    memory cgroup (v1 or v2, this one or an ancestor) allows less. None when unknown."""
    found = [meminfo_available(Path("/proc/meminfo"))]
    found += cgroup_room(Path("/proc/self/cgroup"), Path("/sys/fs/cgroup"))
    known = [n for n in found if n is not None]
    return min(known) if known else None


def meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_room(self_cgroup: Path, root: Path) -> list[int]:
    """Room left under every memory limit on this process's cgroup path: limit less usage,
    with the reclaimable inactive file pages counted as room."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # v2
            folder, names = root / parts[2].lstrip("/"), ("memory.max", "memory.current", "inactive_file")
        elif "memory" in parts[1].split(","):  # v1
            base = root / "memory"
            folder = base / parts[2].lstrip("/")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        while True:
            if (room := _room(folder, *names)) is not None:
                rooms.append(room)
            if folder == root or folder.parent == folder or not str(folder).startswith(str(root)):
                break
            folder = folder.parent
    return rooms


def _room(folder: Path, limit_name: str, usage_name: str, inactive_name: str) -> int | None:
    try:
        limit_text = (folder / limit_name).read_text().strip()
        if limit_text == "max" or int(limit_text) >= 1 << 60:  # v1 "no limit" is a huge number
            return None
        usage = int((folder / usage_name).read_text())
        inactive = 0
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_name:
                inactive = int(value)
        return max(0, int(limit_text) - usage + inactive)
    except (OSError, ValueError):
        return None
