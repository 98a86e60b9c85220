"""CosmoFlow's typed config; `configs/full.yaml` keeps the MLPerf HPC reference values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlhpc.common.contract.config import check_at_least, check_positive
from mlhpc.common.training.loop_config import LoopConfig


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
            raise ValueError(
                f"model.dropout={self.dropout} must be at least 0 and below 1; set model.dropout=0.0"
            )


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """SGD with momentum, linear LR scaling, linear warm-up and step decays (epochs).

    The per-epoch LR, with i = epoch_num - 1 (MLLOG counts epochs from 1) and peak = the scaled LR:
    i < warmup_epochs: base + (peak - base) * i / warmup_epochs; then peak x the factor of the latest
    boundary passed (see decay_first_epoch_num). Every reference run behind a CosmoFlow RCP steps
    it this way, once an epoch."""

    base_learning_rate: float = 0.001
    """LR of the first warm-up epoch, at base_batch_size; the peak LR (logged as
    opt_base_learning_rate, as the HPC rules define it) is base_learning_rate x global / base batch."""
    base_batch_size: int = 64
    momentum: float = 0.9
    momentum_form: Literal["torch", "lr_in_velocity"] = "torch"
    """torch: v = m v + g, p -= lr v. lr_in_velocity: v = m v + lr g, p -= v (Keras and MXNet SGD,
    NVIDIA's FixedSGD: every CosmoFlow reference); the two differ only when the LR changes."""
    weight_decay: float = 0.0
    """On the hidden dense layers' kernels only, as every reference applies it; logged as is."""
    weight_decay_form: Literal["l2_loss", "gradient"] = "gradient"
    """l2_loss: Keras l2(weight_decay) on the loss, a gradient term 2 x weight_decay x w (the TF
    references); gradient: a gradient term weight_decay x w (torch SGD's weight_decay)."""
    warmup_epochs: int = 4
    """LR rises linearly from base_learning_rate to the scaled LR over these epochs."""
    warmup_stepping: Literal["epoch", "step"] = "epoch"
    """epoch: the warm-up LR changes at the start of each epoch, as the references step it;
    step: at every optimizer step."""
    decay_boundary_epochs: tuple[int, ...] = (16, 32)
    decay_factors: tuple[float, ...] = (0.25, 0.125)
    """One per boundary: the multiplier of the peak LR from that boundary on (absolute, not
    compounded, as every reference applies them)."""
    decay_first_epoch_num: Literal["b+1", "b+2"] = "b+1"
    """The first epoch_num trained with boundary b's factor: b+1 (after b epochs; NVIDIA's PyTorch
    LRSchedulerCalculator, `b <= epoch`), or b+2 (mlcommons/hpc TF `_lr_schedule`, NVIDIA's MXNet
    LRScheduler: `b < epoch` with epoch counted from 0)."""
    decay_factor_logged: Literal["list", "max"] = "list"
    """How opt_learning_rate_decay_factor is logged: the list, or its largest value alone (as the
    mlcommons/hpc TF reference logs it: max(decay_schedule.values()))."""

    def __post_init__(self) -> None:
        check_positive("optimizer.base_learning_rate", self.base_learning_rate)
        check_at_least("optimizer.base_batch_size", self.base_batch_size, 1)
        for name in ("momentum", "weight_decay", "warmup_epochs"):
            check_at_least(f"optimizer.{name}", getattr(self, name), 0)
        if len(self.decay_factors) != len(self.decay_boundary_epochs):
            raise ValueError(
                f"optimizer.decay_boundary_epochs has {len(self.decay_boundary_epochs)} entries but "
                f"optimizer.decay_factors has {len(self.decay_factors)}; give one factor per boundary "
                "(the multiplier of the peak LR from that boundary on)"
            )

    def gradient_weight_decay(self) -> float:
        """The coefficient of w added to the gradient of a decayed kernel."""
        return 2.0 * self.weight_decay if self.weight_decay_form == "l2_loss" else self.weight_decay

    def decay_multiplier(self, epoch_index: int) -> float:
        """The multiplier of the peak LR in epoch `epoch_index` (epoch_num - 1), after the warm-up."""
        lag = 0 if self.decay_first_epoch_num == "b+1" else 1
        factor = 1.0
        for boundary, value in zip(self.decay_boundary_epochs, self.decay_factors, strict=True):
            if epoch_index >= boundary + lag:
                factor = value
        return factor


@dataclass(kw_only=True, frozen=True)
class CosmoFlowConfig:
    data: DataConfig
    model: ModelConfig
    optimizer: OptimizerConfig
    loop: LoopConfig
