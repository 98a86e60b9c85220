"""The staging planner: which node holds which file and which rank moves it (pure, no I/O).

`replicate`: every node ends with the whole dataset, and each source file is read once in total:
its reader sends it to the other nodes. `shard`: node n holds only its 1/N of the bytes. `copy`:
every node reads the whole dataset from the source itself (the simple baseline).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from mlhpc.common.vocabulary import STAGING_MODES, StagingMode
from mlhpc.staging.manifest import FileEntry, Manifest

Mode = StagingMode
MODES = STAGING_MODES


@dataclass(frozen=True)
class Topology:
    """Where one rank sits for staging: its node (one node-local directory) and its place in it."""

    node: int
    num_nodes: int
    local_rank: int
    local_size: int
    exchange_ranks: int = 0
    """Local ranks per node that take part in the exchange (the smallest node's rank count);
    0 means all of `local_size`."""

    def __post_init__(self) -> None:
        if not 0 <= self.node < self.num_nodes:
            raise ValueError(f"node={self.node} is outside 0..{self.num_nodes - 1}")
        if not 0 <= self.local_rank < self.local_size:
            raise ValueError(f"local_rank={self.local_rank} is outside 0..{self.local_size - 1}")
        if self.exchange_ranks == 0:
            object.__setattr__(self, "exchange_ranks", self.local_size)

    @property
    def in_exchange(self) -> bool:
        return self.local_rank < self.exchange_ranks


@dataclass(frozen=True)
class CopyOp:
    """Copy one file of the dataset from the source; `entry.path` is relative to the source root."""

    entry: FileEntry


@dataclass(frozen=True)
class StreamItem:
    """One file in a sender's stream; `from_dest`: the sender already holds a verified copy and
    sends that instead of reading the source again."""

    entry: FileEntry
    from_dest: bool = False


@dataclass(frozen=True)
class Exchange:
    """What the nodes of one peer group (the same local rank on every node) send: streams[n] is
    the files node n reads and sends, in order, as one byte stream cut into rounds of chunks."""

    streams: tuple[tuple[StreamItem, ...], ...]

    def stream_bytes(self, node: int) -> int:
        return sum(item.entry.size for item in self.streams[node])

    def rounds(self, chunk_bytes: int) -> int:
        longest = max((self.stream_bytes(n) for n in range(len(self.streams))), default=0)
        return -(-longest // chunk_bytes)


def balance(entries: Sequence[FileEntry], bins: int) -> list[list[FileEntry]]:
    """Deal files largest first to the bin with the fewest bytes so far; each bin sorted by path."""
    if bins <= 0:
        raise ValueError(f"bins={bins} must be positive")
    heap = [(0, b) for b in range(bins)]
    out: list[list[FileEntry]] = [[] for _ in range(bins)]
    for entry in sorted(entries, key=lambda f: (-f.size, f.path)):
        load, b = heapq.heappop(heap)
        out[b].append(entry)
        heapq.heappush(heap, (load + entry.size, b))
    for share in out:
        share.sort(key=lambda f: f.path)
    return out


def node_files(manifest: Manifest, mode: Mode, topo: Topology) -> list[FileEntry]:
    """The files this node holds when staging is done."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; use one of {', '.join(MODES)}")
    if mode == "shard" and topo.num_nodes > 1:
        return balance(manifest.files, topo.num_nodes)[topo.node]
    return sorted(manifest.files, key=lambda f: f.path)


def rank_files(manifest: Manifest, mode: Mode, topo: Topology) -> list[FileEntry]:
    """The files this rank is responsible for on its node (copying them, or receiving them)."""
    files = node_files(manifest, mode, topo)
    if uses_exchange(mode, topo):
        if not topo.in_exchange:
            return []
        return balance(files, topo.exchange_ranks)[topo.local_rank]
    return balance(files, topo.local_size)[topo.local_rank]


def uses_exchange(mode: Mode, topo: Topology) -> bool:
    return mode == "replicate" and topo.num_nodes > 1


def plan_copies(files: Sequence[FileEntry], have: frozenset[str]) -> list[CopyOp]:
    """Copy what this rank is responsible for and its node does not hold yet."""
    return [CopyOp(entry) for entry in files if entry.path not in have]


def read_first_order(entries: Sequence[FileEntry], first: Sequence[str]) -> list[FileEntry]:
    """`entries` in the order training reads them (`first`, see `plan_exchange`), the rest after
    in their own order."""
    position = {path: i for i, path in enumerate(first)}
    return sorted(entries, key=lambda e: position.get(e.path, len(position)))


def plan_exchange(
    files: Sequence[FileEntry],
    have: Sequence[frozenset[str]],
    send_from_dest: bool = True,
    first: Sequence[Sequence[str]] | None = None,
) -> Exchange:
    """Split a peer group's files over its nodes as senders; `have[n]`: what node n holds already.

    A file every node holds is skipped; one some nodes hold is sent by one of them from its
    node-local copy (unless `send_from_dest` is off: a decompressed copy differs from its
    source); the rest are read from the source, each by exactly one node.

    `first[n]` (training while staging): the files node n's ranks read first, in that order. Each
    is sent by that node, early in its stream, so that the node reads it from the source once,
    for its training and for the others alike.
    """
    reader = {path: n for n, paths in enumerate(first or ()) for path in reversed(paths)}
    nodes = len(have)
    held: dict[str, list[int]] = {}
    for n, paths in enumerate(have):
        for path in paths:
            held.setdefault(path, []).append(n)
    loads = [0] * nodes
    heap = [(0, n) for n in range(nodes)]  # (load, node); an entry is stale once its node's load grew
    streams: list[list[StreamItem]] = [[] for _ in range(nodes)]
    for entry in sorted(files, key=lambda f: (-f.size, f.path)):
        holders = held.get(entry.path, [])
        if len(holders) == nodes:
            continue
        if not send_from_dest:
            holders = []
        if holders:
            sender = min(holders, key=lambda n: (loads[n], n))
        elif entry.path in reader:
            sender = reader[entry.path]
        else:
            while heap[0][0] != loads[heap[0][1]]:  # drop entries made stale by a later load
                heapq.heappop(heap)
            sender = heapq.heappop(heap)[1]
        loads[sender] += entry.size
        heapq.heappush(heap, (loads[sender], sender))
        streams[sender].append(StreamItem(entry, from_dest=bool(holders)))
    ordered = []
    for n, stream in enumerate(streams):
        position = {path: i for i, path in enumerate(first[n])} if first else {}
        ordered.append(
            tuple(sorted(stream, key=lambda i: (position.get(i.entry.path, len(position)), i.entry.path)))
        )
    return Exchange(tuple(ordered))
