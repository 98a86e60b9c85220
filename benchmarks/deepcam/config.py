"""DeepCAM's typed config; `configs/full.yaml` keeps the MLPerf HPC reference values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlhpc.common.contract.config import check_at_least
from mlhpc.common.training.loop_config import LoopConfig

# Pixel frequencies of background, tropical cyclone and atmospheric river in the real training
# set, and the power the reference raises them to for the cross-entropy class weights.
REFERENCE_CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
REFERENCE_WEIGHT_POWER = -0.125


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """The dataset: one file per sample in train/ and validation/, stats.h5 at the root."""

    height: int
    """Latitude points (768 in the real dataset); a multiple of the model's output stride."""
    width: int
    """Longitude points (1152 in the real dataset); a multiple of the model's output stride."""
    num_channels: int = 16
    """Input channels (16 CAM5 variables in the real dataset)."""
    num_train_samples: int
    """Training samples the generator writes (121,266 in the real dataset)."""
    num_eval_samples: int
    """Validation samples the generator writes (15,158 in the real dataset)."""
    format: Literal["hdf5", "numpy"] = "hdf5"
    """hdf5: the reference's data-*.h5; numpy: the optimized submissions' data-*.npy + label-*.npy."""
    loader: Literal["auto", "torch", "dali"] = "auto"
    """torch DataLoader (always works) or a DALI pipeline fed by h5py/numpy readers (the gpu extra)."""
    num_workers: int = 0
    """DataLoader worker processes (DALI reader threads when loader=dali)."""

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_channels", "num_train_samples", "num_eval_samples"):
            check_at_least(f"data.{name}", getattr(self, name), 1)


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """DeepLabv3+ with the reference's modified aligned Xception backbone."""

    output_stride: Literal[16, 8] = 16
    """Input size over the backbone's feature size (16 in the reference)."""
    width_multiplier: float = 1.0
    """Scales every layer width of the reference (1.0: 32 ... 2048 backbone, 256 head, 48 skip)."""
    middle_blocks: int = 16
    """728-wide residual blocks in the middle flow (16 in the reference)."""

    def __post_init__(self) -> None:
        if not 0 < self.width_multiplier <= 4:
            raise ValueError(f"model.width_multiplier={self.width_multiplier} must be in (0, 4]")
        if self.middle_blocks < 0:
            raise ValueError(f"model.middle_blocks={self.middle_blocks} must be at least 0")


@dataclass(kw_only=True, frozen=True)
class LossConfig:
    """Per-class weighted cross-entropy: weight_c = frequency_c ** weight_power."""

    class_frequencies: tuple[float, ...] = REFERENCE_CLASS_FREQUENCIES
    """Pixel frequency of each class (the reference's, measured on the real training set)."""
    weight_power: float = REFERENCE_WEIGHT_POWER

    def __post_init__(self) -> None:
        if len(self.class_frequencies) != 3 or min(self.class_frequencies) <= 0:
            raise ValueError("loss.class_frequencies needs 3 positive values (background, TC, AR)")


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """LAMB (the closed-division reference), AdamW or Adam, with a warm-up and a step schedule."""

    name: Literal["LAMB", "AdamW", "Adam"] = "LAMB"
    lr: float
    """Peak learning rate (after warm-up)."""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    """The rules fix it at 1e-6."""
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    """LAMB clips the global gradient norm to this before its update (the rules fix 1.0)."""
    scheduler: Literal["multistep", "cosine_annealing"] = "multistep"
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up; the LR starts at 0 when warmup_factor is 1."""
    warmup_factor: float = 1.0
    """>1: warm up from lr to lr * warmup_factor instead of from 0 to lr."""
    milestones: tuple[int, ...] = ()
    """multistep: optimizer steps after the warm-up at which the LR is multiplied by decay_rate."""
    decay_rate: float = 0.1
    t_max: int = 1
    """cosine_annealing: optimizer steps after the warm-up from the peak LR down to eta_min."""
    eta_min: float = 0.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optimizer.lr={self.lr} must be positive")
        for name in ("weight_decay", "max_grad_norm", "decay_rate", "eta_min"):
            check_at_least(f"optimizer.{name}", getattr(self, name), 0)
        if len(self.betas) != 2:
            raise ValueError(f"optimizer.betas={list(self.betas)} needs two values, e.g. [0.9, 0.999]")
        if self.warmup_steps < 0 or self.warmup_factor < 1:
            raise ValueError("optimizer.warmup_steps must be >= 0 and optimizer.warmup_factor >= 1")
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"optimizer.milestones={list(self.milestones)} must be increasing")
        if self.t_max < 1:
            raise ValueError(f"optimizer.t_max={self.t_max} must be at least 1")


@dataclass(kw_only=True, frozen=True)
class DeepCamConfig:
    data: DataConfig
    model: ModelConfig
    loss: LossConfig = LossConfig()
    optimizer: OptimizerConfig
    loop: LoopConfig

    def __post_init__(self) -> None:
        stride = self.model.output_stride
        if self.data.height % stride or self.data.width % stride:
            raise ValueError(
                f"data.height={self.data.height} and data.width={self.data.width} must be multiples "
                f"of model.output_stride={stride}"
            )
