"""A paper model of staging time against node count, for datasets too large for this machine.

Staging is a pipeline (read from the shared file system, send over the network, write to
node-local disk), so its time is set by its slowest stage; each mode loads the stages
differently. All bandwidths are in bytes per second and are assumptions, stated by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlhpc.staging.plan import Mode

TB = 10**12
GB = 10**9


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
    fs_total = dataset_bytes * (nodes if mode == "copy" else 1)
    stages = {
        "shared FS": fs_total / cluster.shared_fs_bytes_s,
        "client": (dataset_bytes / nodes if mode != "copy" else dataset_bytes) / cluster.client_bytes_s,
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
    modes: tuple[Mode, ...] = ("copy", "replicate", "shard")
    head = "| dataset | mode | " + " | ".join(f"{n} node{'s' * (n > 1)}" for n in node_counts) + " |"
    lines = [head, "|" + "---|" * (2 + len(node_counts))]
    for name, size in DATASETS.items():
        for mode in modes:
            cells = []
            for n in node_counts:
                e = staging_time(size, n, mode, cluster)
                cells.append(f"{_duration(e.seconds)} ({e.bound})" if e.fits else "does not fit")
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
