"""The model of staging time against node count, the one `mlhpc stage-bench --model` prints and
perf/cluster_staging.py sets beside its measurements, at two scales: on paper for datasets too
large for this machine (`staging_time`), and for `mlhpc stage` on the virtual cluster
(`model_seconds`, with the exchange's rounds).

Staging is a pipeline (read from the shared file system, send over the network, write to
node-local disk), so its time is set by its slowest stage; each mode loads the stages
differently, and both scales load them alike (`reads`). They part where the virtual cluster's
trace showed them to: there one link carries a node's reads and its exchange, one after the
other. All bandwidths are in bytes per second and are assumptions, stated by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mlhpc.staging.exchange import HEADER_BYTES, chunk_size
from mlhpc.staging.manifest import FileEntry
from mlhpc.staging.plan import Mode, balance, plan_exchange
from mlhpc.staging.request import DEFAULT_CHUNK_BYTES

TB = 10**12
GB = 10**9
MODES: tuple[Mode, ...] = ("copy", "replicate", "shard")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The bandwidths that bound staging."""

    shared_fs_bytes_s: float = 100 * GB
    """Aggregate read bandwidth of the shared file system (all clients together)."""
    client_bytes_s: float = 10 * GB
    """What one node can read from the shared file system (its client and link)."""
    network_bytes_s: float = 25 * GB
    """Injection bandwidth of one node's network link (one 200 Gb/s HDR InfiniBand port)."""
    local_write_bytes_s: float = 6 * GB
    """Sequential write bandwidth of one node's local NVMe."""
    local_capacity_bytes: float = 7.68 * TB
    """Node-local disk capacity."""


def reads(mode: str, nodes: int, total: float, share: float) -> tuple[float, float]:
    """(bytes the shared file system serves, bytes one node reads from it) to stage `total` bytes
    onto `nodes` nodes: in copy every node reads all of it, else each reads its `share` once."""
    if mode == "copy":
        return total * nodes, total
    return total, share


@dataclass(frozen=True)
class Estimate:
    seconds: float
    bound: str
    """The stage that sets the time: 'shared FS', 'client', 'network', 'local disk'."""
    fits: bool
    """Whether the node's share fits on its local disk."""


def staging_time(dataset_bytes: float, nodes: int, mode: Mode, cluster: Cluster) -> Estimate:
    """Seconds to stage `dataset_bytes` onto `nodes` nodes in `mode`, and what bounds it.

    copy: every node reads the whole dataset from the shared FS (N x D read in total).
    replicate: the shared FS is read once (D), each node receives (N-1)/N x D over the network
    and writes D. shard: each node reads and writes D/N.
    """
    per_node = dataset_bytes / nodes if mode == "shard" else dataset_bytes
    fs_total, node_reads = reads(mode, nodes, dataset_bytes, dataset_bytes / nodes)
    stages = {
        "shared FS": fs_total / cluster.shared_fs_bytes_s,
        "client": node_reads / cluster.client_bytes_s,
        "local disk": per_node / cluster.local_write_bytes_s,
    }
    if mode == "replicate" and nodes > 1:
        stages["network"] = dataset_bytes * (nodes - 1) / nodes / cluster.network_bytes_s
    bound = max(stages, key=lambda k: stages[k])
    return Estimate(stages[bound], bound, per_node <= cluster.local_capacity_bytes)


DATASETS = {
    "CosmoFlow (gzip TFRecords)": 1.7 * TB,
    "CosmoFlow (npy, uncompressed)": 5.1 * TB,
    "DeepCAM": 8.8 * TB,
}


def model_table(cluster: Cluster, node_counts: tuple[int, ...] = (1, 16, 64, 256, 1024)) -> str:
    """A markdown table: minutes to stage each dataset per mode and node count."""
    head = "| dataset | mode | " + " | ".join(f"{n} node{'s' * (n > 1)}" for n in node_counts) + " |"
    lines = [head, "|" + "---|" * (2 + len(node_counts))]
    for name, size in DATASETS.items():
        for mode in MODES:
            cells = []
            for n in node_counts:
                e = staging_time(size, n, mode, cluster)
                cells.append(f"{_duration(e.seconds)} ({e.bound})" if e.fits else "does not fit")
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


GOODPUT = 1448 / 1514
"""TCP payload per full Ethernet frame (MTU 1500, TCP timestamps on): tc's rate counts whole
frames, the staging counts payload."""


# --- on the virtual cluster (perf/cluster_staging.py): tc-shaped links, sshfs as the shared FS ---


@dataclass(frozen=True, kw_only=True)
class Setup:
    """The bandwidths that bound staging on the virtual cluster, as tc shapes them."""

    link_bit_s: float
    """Each compute node's link, each direction (tc rate, bits per second)."""
    fs_bit_s: float
    """The storage node's link: the shared file system's bandwidth for all clients together."""
    overhead_s: float = 0.0
    """The fixed cost of one staging (measured with a tiny dataset, `calibrate`)."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """`mlhpc stage --chunk-mib`: the exchange's chunk per node and round."""
    allgather_bytes_s: tuple[tuple[int, float], ...] = ()
    """(nodes, bytes per second into each node) of the exchange's all-gather alone, measured
    (`allgather`); a node count not listed moves at the link's rate."""

    def gather_bytes_s(self, nodes: int) -> float:
        return dict(self.allgather_bytes_s).get(nodes, self.link_bytes_s)

    def at_link_rate(self) -> Setup:
        """This setup with the all-gather at the link's rate: the model from the shaped rates alone."""
        return replace(self, allgather_bytes_s=())

    @property
    def link_bytes_s(self) -> float:
        return self.link_bit_s / 8 * GOODPUT

    @property
    def fs_bytes_s(self) -> float:
        return self.fs_bit_s / 8 * GOODPUT


def gather_stride(nodes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Bytes each node sends in one round of the exchange's all-gather: its chunk, padded to full
    size, and the header (staging/exchange.py)."""
    return chunk_size(chunk_bytes, nodes) + HEADER_BYTES


def entries(sizes: Sequence[int]) -> list[FileEntry]:
    return [FileEntry(f"f{i:05d}.bin", size, "") for i, size in enumerate(sizes)]


def model_seconds(mode: str, nodes: int, sizes: Sequence[int], setup: Setup) -> float:
    """Seconds `mlhpc stage --mode MODE` takes on `nodes` nodes for files of `sizes` bytes.

    Every node's data comes in over its own link (B_l) and all file-system reads share the
    storage link (B_fs). copy: each node reads all S, the storage link carries N x S.
    shard: each node reads its share (the planner's `balance`), S in total. replicate (N > 1):
    each node reads its stream (the planner's `plan_exchange`), S in total; the exchange
    (`staging/exchange.py`) runs R rounds of a ring all-gather (gloo) that brings each node the
    other N-1 chunks of the round, each padded to the full chunk plus a header. Reading and
    gathering are counted one after the other: the trace in docs/STAGING.md shows the reads
    taking the shared incoming link while they run (the reader runs up to three chunks ahead)
    and the all-gathers moving at their own rate after them.
    """
    total = sum(sizes)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: give one of {', '.join(MODES)}")
    if nodes == 1 or mode == "copy":
        return setup.overhead_s + _read_seconds("copy", nodes, total, total, setup)
    if mode == "shard":
        share = max(sum(f.size for f in b) for b in balance(entries(sizes), nodes))
        return setup.overhead_s + _read_seconds(mode, nodes, total, share, setup)
    exchange = plan_exchange(entries(sizes), [frozenset()] * nodes)
    longest = max(exchange.stream_bytes(n) for n in range(nodes))
    rounds = exchange.rounds(chunk_size(setup.chunk_bytes, nodes))
    gathered = rounds * (nodes - 1) * gather_stride(nodes, setup.chunk_bytes)  # into each node
    return (
        setup.overhead_s
        + _read_seconds(mode, nodes, total, longest, setup)
        + gathered / setup.gather_bytes_s(nodes)
    )


def _read_seconds(mode: str, nodes: int, total: float, share: float, setup: Setup) -> float:
    """The reads' time: the storage link serves them all, each node's link carries its own."""
    fs_total, node_reads = reads(mode, nodes, total, share)
    return max(fs_total / setup.fs_bytes_s, node_reads / setup.link_bytes_s)


def crossover(nodes: Sequence[int], copy_s: Sequence[float], replicate_s: Sequence[float]) -> float | None:
    """The node count from which "every node reads" (copy) is slower than "read once"
    (replicate) at every larger count, interpolated linearly between the two counts around it;
    None when copy is never slower at the largest count."""
    diff = [c - r for c, r in zip(copy_s, replicate_s, strict=True)]
    if not diff or diff[-1] <= 0:
        return None
    last = max((i for i, d in enumerate(diff) if d <= 0), default=None)
    if last is None:
        return float(nodes[0])
    n0, n1, d0, d1 = nodes[last], nodes[last + 1], diff[last], diff[last + 1]
    return n0 + (n1 - n0) * (-d0) / (d1 - d0)


def model_crossover(sizes: Sequence[int], setup: Setup, largest: int = 64) -> float | None:
    """The model's crossover over every whole node count up to `largest`."""
    counts = list(range(1, largest + 1))
    return crossover(
        counts,
        [model_seconds("copy", n, sizes, setup) for n in counts],
        [model_seconds("replicate", n, sizes, setup) for n in counts],
    )
