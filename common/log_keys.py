"""MLLOG keys of our own (mlperf_logging.constants has none for them), shared by the benchmarks
that log them and the checker that reads them; no torch here, so the checker can import it."""

FLOPS_PER_SAMPLE = "flops_per_sample"
"""Forward + backward FLOPs of one training sample."""
ACHIEVED_FLOPS = "achieved_flops_per_s"
"""Training FLOPs over forward + backward time, summed over ranks (a compute rate; HPC AI500's
FLOPS is over the run's time, submission_checker/hpc_ai500.py)."""
VALID_FLOPS = "valid_flops"
"""HPC AI500's Valid FLOPS: FLOPS over the run's time x (achieved quality / target quality)^n."""
VFLOPS_EXPONENT = "vflops_exponent"
"""The n of Valid FLOPS."""
LOOP_MODE = "loop_mode"
"""loop.mode of the run: 'target' (MLPerf's time-to-train) or 'fixed_epochs' (HPC AI500's fixed
epochs, scored by Valid FLOPS); logged before run_start. A log without it is a target-mode log."""
