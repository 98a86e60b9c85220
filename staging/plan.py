"""The staging planner: which rank copies which file (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from mlhpc.staging.manifest import FileEntry, Manifest


@dataclass(frozen=True)
class CopyOp:
    """Copy one file of the dataset; `entry.path` is relative to both roots."""

    entry: FileEntry


def plan_node_copies(manifest: Manifest, local_rank: int, local_size: int) -> list[CopyOp]:
    """Every node gets the whole dataset; its local ranks split the files round-robin by size.

    Files are dealt largest first to the rank with the fewest bytes so far, so ranks finish
    together even when file sizes differ.
    """
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank={local_rank} is outside 0..{local_size - 1}")
    loads = [0] * local_size
    mine: list[CopyOp] = []
    for entry in sorted(manifest.files, key=lambda f: (-f.size, f.path)):
        rank = min(range(local_size), key=lambda r: (loads[r], r))
        loads[rank] += entry.size
        if rank == local_rank:
            mine.append(CopyOp(entry))
    return mine
