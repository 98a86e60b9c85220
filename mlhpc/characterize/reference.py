"""The published per-sample characterization of CosmoFlow and DeepCAM (Ibrahim et al., PMBS 2021,
Table II and its text, measured on V100 with AMP) beside mlhpc's analytic figures for the full
configs, each difference with its reason. Pure functions over the analytic level's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE = (
    "K. Z. Ibrahim, T. Nguyen, H. A. Nam, W. Bhimji, S. Farrell, L. Oliker, M. Rowan, N. J. Wright, "
    "S. Williams, 'Architectural Requirements for Deep Learning Workloads in HPC Environments', "
    "PMBS 2021 (SC21 workshop), doi:10.1109/PMBS54543.2021.00007: Table II and sections V-A, VII"
)
GiB = 2**30
MiB = 2**20
GiF = 2**30
"""The paper's 'GiF': 2^30 FLOPs, as its GiB (a third-party copy of the table reads it so too)."""
PAPER_BYTES_PER_VALUE = 2
"""The paper assumes every floating-point tensor is 16-bit (AMP): its sample sizes and activation
memory are counted at 2 bytes a value; mlhpc's are converted to that before comparing."""


@dataclass(frozen=True)
class Published:
    sample_mib: float
    flops_gif: float
    """Measured with Nsight Compute (forward + backward), not counted from the layers."""
    activation_gib: float
    """Asymptotic (large-batch) activation memory per sample, from the paper's layer model."""
    hbm_limit_gib: float
    """'HBM/sample (limit)': each activation byte written once and read once (2 x activations)."""
    hbm_measured_gib: float
    flop_per_sample_byte: float
    flop_per_hbm_byte_limit: float
    flop_per_hbm_byte_measured: float
    sustained_hbm_gb_s: float
    input_gb_s_per_pflops: float
    """Section VII: the input bandwidth a 1 PFLOP/s node needs."""


PUBLISHED = {
    "cosmoflow": Published(
        sample_mib=16,
        flops_gif=247,
        activation_gib=0.72,
        hbm_limit_gib=1.44,
        hbm_measured_gib=6.4,
        flop_per_sample_byte=15_400,
        flop_per_hbm_byte_limit=171,
        flop_per_hbm_byte_measured=38.6,
        sustained_hbm_gb_s=127,
        input_gb_s_per_pflops=65,
    ),
    "deepcam": Published(
        sample_mib=27,
        flops_gif=2887,
        activation_gib=2.9,
        hbm_limit_gib=5.8,
        hbm_measured_gib=52,
        flop_per_sample_byte=107_000,
        flop_per_hbm_byte_limit=498,
        flop_per_hbm_byte_measured=55.5,
        sustained_hbm_gb_s=270,
        input_gb_s_per_pflops=9,
    ),
}
"""Table II's configurations are the reference's full-size ones: only `--config full` is compared."""

WHY_FLOPS = (
    "mlhpc counts convolutions and dense layers from their shapes (a multiply-add is 2 FLOPs; backward "
    "= weight gradient + input gradient, none for the first layer's input); the paper's figure is "
    "measured by Nsight Compute, which also counts normalisation, activations and the optimizer, and "
    "the kernels' own extra work; the paper says its measured FLOPs are roughly twice its layer model"
)
WHY_SAMPLE = (
    "the model's input at 2 bytes a value, as the paper counts it (16-bit); mlhpc's own files hold "
    "{on_disk} bytes a sample (see 'sample bytes on disk')"
)
WHY_ACTIVATION = (
    "the tensors autograd saves for the backward pass at one sample, at 2 bytes a value; the paper's is "
    "its layer model's large-batch asymptote (activations that cannot be released at once)"
)
WHY_DERIVED = "derived from the rows above, by the paper's own formula"
WHY_MEASURED = "measured on a V100 by Nsight Compute; mlhpc's timed levels measure this machine instead"


def compare(benchmark: str, config: str, analytic: Any) -> dict[str, Any] | None:
    """Rows of (quantity, mlhpc, published, unit, mlhpc/published, why) for the full configs of the
    two characterized benchmarks; None for anything else (no published figures to compare)."""
    published = PUBLISHED.get(benchmark)
    if published is None or config != "full":
        return None
    sample = analytic.model_input_values_per_sample * PAPER_BYTES_PER_VALUE
    activation = analytic.activation_float_values_per_sample * PAPER_BYTES_PER_VALUE
    flops = analytic.training_flops_per_sample
    rows = [
        _row("sample size", sample / MiB, published.sample_mib, "MiB",
             WHY_SAMPLE.format(on_disk=f"{analytic.sample_bytes:,}")),
        _row("FLOPs per sample", flops / GiF, published.flops_gif, "GiF", WHY_FLOPS),
        _row("activation memory per sample", activation / GiB, published.activation_gib, "GiB", WHY_ACTIVATION),
        _row("HBM per sample (limit: activations written and read once)", 2 * activation / GiB,
             published.hbm_limit_gib, "GiB", WHY_DERIVED),
        _row("FLOP per sample byte", flops / sample, published.flop_per_sample_byte, "FLOP/B", WHY_DERIVED),
        _row("FLOP per HBM byte (limit)", flops / (2 * activation), published.flop_per_hbm_byte_limit,
             "FLOP/B", WHY_DERIVED),
        _row("input bandwidth per PFLOP/s", 1e15 * sample / flops / 1e9, published.input_gb_s_per_pflops,
             "GB/s", WHY_DERIVED),
        _row("HBM per sample (measured)", None, published.hbm_measured_gib, "GiB", WHY_MEASURED),
        _row("FLOP per HBM byte (measured)", None, published.flop_per_hbm_byte_measured, "FLOP/B", WHY_MEASURED),
        _row("sustained HBM bandwidth", None, published.sustained_hbm_gb_s, "GB/s", WHY_MEASURED),
    ]
    return {"source": SOURCE, "rows": rows}


def _row(quantity: str, ours: float | None, published: float, unit: str, why: str) -> dict[str, Any]:
    ratio = ours / published if ours is not None and published else None
    return {"quantity": quantity, "mlhpc": ours, "published": published, "unit": unit, "ratio": ratio, "why": why}
