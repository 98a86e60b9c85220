"""CosmoFlow's typed config; `configs/full.yaml` keeps the MLPerf HPC reference values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlhpc.common.config import check_at_least, check_positive
from mlhpc.common.loop_config import LoopConfig


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """The dataset: per-sample numpy files in train/ and validation/."""

    sample_size: int
    """Edge of the cube in voxels (128 in the real dataset)."""
    num_channels: int = 4
    """Channels per voxel (4 redshifts in the real dataset)."""
    num_train_samples: int
    """Training samples the generator writes (524,288 in the real dataset)."""
    num_eval_samples: int
    """Validation samples the generator writes (65,536 in the real dataset)."""
    apply_log: bool = True
    """Feed log(1 + counts) to the model, as the reference does."""
    loader: Literal["auto", "torch", "dali"] = "auto"
    """torch DataLoader (always works) or DALI's numpy reader (the gpu extra)."""
    num_workers: int = 0
    """DataLoader worker processes (DALI threads when loader=dali)."""

    def __post_init__(self) -> None:
        if self.sample_size < 2:
            raise ValueError(f"data.sample_size={self.sample_size} must be at least 2")
        for name in ("num_channels", "num_train_samples", "num_eval_samples"):
            check_at_least(f"data.{name}", getattr(self, name), 1)
        check_at_least(
            "data.num_workers",
            self.num_workers,
            0,
            "set data.num_workers=0 (load in the main process) or more",
        )


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The CosmoFlow 3D CNN."""

    conv_layers: int = 5
    """Conv + LeakyReLU + max-pool blocks; filters double each block."""
    base_filters: int = 32
    """Filters of the first block (32 in the reference: 32, 64, 128, 256, 512)."""
    kernel_size: int = 3
    dense_units: tuple[int, ...] = (128, 64)
    """Hidden fully connected layers before the 4 outputs."""
    dropout: float = 0.0
    """Dropout after each hidden dense layer (0.0 or 0.5 by RCP reference)."""

    def __post_init__(self) -> None:
        # Checked here, before a campaign records the config: a model of these sizes must build.
        check_at_least("model.conv_layers", self.conv_layers, 0)
        check_at_least("model.base_filters", self.base_filters, 1)
        check_at_least("model.kernel_size", self.kernel_size, 1)
        for units in self.dense_units:
            check_at_least("model.dense_units", units, 1, "give every hidden layer 1 unit or more")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.dropout={self.dropout} must be at least 0 and below 1; set model.dropout=0.0")


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """SGD with momentum, linear LR scaling, linear warm-up and step decays (epochs)."""

    base_learning_rate: float = 0.001
    """LR at base_batch_size (logged as opt_base_learning_rate); scaled linearly with the global
    batch size: the peak LR is base_learning_rate x warm-up factor (global / base batch size)."""
    base_batch_size: int = 64
    momentum: float = 0.9
    weight_decay: float = 0.0
    """On the hidden dense layers' kernels only, as both references apply it."""
    warmup_epochs: int = 4
    """LR rises linearly from base_learning_rate to the scaled LR over these epochs."""
    decay_boundary_epochs: tuple[int, ...] = (16, 32)
    decay_factors: tuple[float, ...] = (0.25,)
    """One per boundary: the multiplier of the scaled LR from that epoch on; or a single factor
    applied again at every boundary (0.25 at (16, 32): x0.25, then x0.0625), logged as that one
    number, as the RCP references at batch 64, 128 and 1024 write it."""

    def __post_init__(self) -> None:
        check_positive("optimizer.base_learning_rate", self.base_learning_rate)
        check_at_least("optimizer.base_batch_size", self.base_batch_size, 1)
        for name in ("momentum", "weight_decay", "warmup_epochs"):
            check_at_least(f"optimizer.{name}", getattr(self, name), 0)
        if len(self.decay_factors) not in (1, len(self.decay_boundary_epochs)):
            raise ValueError(
                f"optimizer.decay_boundary_epochs has {len(self.decay_boundary_epochs)} entries but "
                f"optimizer.decay_factors has {len(self.decay_factors)}; give one factor per boundary, "
                "or one factor for every boundary"
            )

    def decay_multiplier(self, boundaries_passed: int) -> float:
        """The multiplier of the scaled LR once this many decay boundaries have passed."""
        if boundaries_passed == 0:
            return 1.0
        if len(self.decay_factors) == 1:
            return self.decay_factors[0] ** boundaries_passed
        return self.decay_factors[boundaries_passed - 1]


@dataclass(kw_only=True, frozen=True)
class CosmoFlowConfig:
    data: DataConfig
    model: ModelConfig
    optimizer: OptimizerConfig
    loop: LoopConfig
