"""mlhpc: an MLPerf-HPC-style time-to-train submission harness."""

from mlhpc.common.cluster.spin import wait_briefly

__version__ = "0.1.0"

# Before anything imports torch: its OpenMP runtime reads how long threads spin once, at load.
wait_briefly()
