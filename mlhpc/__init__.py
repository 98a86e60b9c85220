"""mlhpc: an MLPerf-HPC-style time-to-train submission harness."""

__version__ = "0.1.0"
