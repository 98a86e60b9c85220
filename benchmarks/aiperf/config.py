"""AIPerf's typed config: `configs/full.yaml` keeps AIPerf's published settings, `mini.yaml` the CPU run."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlhpc.common.contract.config import check_at_least, check_positive

STEMS = ("imagenet", "small")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """ImageNet's layout (train/ and val/ folders of JPEGs by class) and what the generator writes."""

    image_size: int = 224
    """The side the trials train at (224 in AIPerf)."""
    classes: int = 1000
    """Classes the generator writes; a real dataset brings its own (the model's output follows it)."""
    train_per_class: int = 1281
    """Training images a class the generator writes."""
    val_per_class: int = 50
    """Validation images a class the generator writes."""
    resolution: int = 256
    """The side of the JPEGs the generator writes (the loader resizes to image_size)."""
    mislabeled_percent: int = 0
    """The generator's share of images that show a random class's look under their label: an error
    no model removes, which keeps top-1 below 1 (the CPU mini's learnable data would reach 1.0)."""
    num_workers: int = 0
    """DataLoader worker processes a rank."""

    def __post_init__(self) -> None:
        check_at_least("data.image_size", self.image_size, 16)
        check_at_least("data.classes", self.classes, 2)
        check_at_least("data.train_per_class", self.train_per_class, 1)
        check_at_least("data.val_per_class", self.val_per_class, 1)
        check_at_least("data.resolution", self.resolution, 16)
        if not 0 <= self.mislabeled_percent <= 100:
            raise ValueError(f"data.mislabeled_percent={self.mislabeled_percent} must be from 0 to 100")

    @property
    def num_train_samples(self) -> int:
        """Training images the generator writes (the name every benchmark's size check reads)."""
        return self.classes * self.train_per_class

    @property
    def num_eval_samples(self) -> int:
        return self.classes * self.val_per_class


@dataclass(kw_only=True, frozen=True)
class SeedConfig:
    """The network the search starts from: ResNet-50 in AIPerf (bottleneck blocks, 4 stages)."""

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    stem: str = "imagenet"
    """imagenet: 7x7/2 convolution and 3x3/2 max pool; small: one 3x3/1 convolution (tiny images)."""

    def __post_init__(self) -> None:
        if not self.blocks or any(b < 1 for b in self.blocks) or len(self.blocks) > 6:
            raise ValueError(f"seed.blocks={list(self.blocks)} must be 1 to 6 stages of 1 block or more")
        check_at_least("seed.width", self.width, 1)
        if self.stem not in STEMS:
            raise ValueError(f"seed.stem={self.stem!r} must be one of {', '.join(STEMS)}")


@dataclass(kw_only=True, frozen=True)
class SearchConfig:
    """How long the search runs and what each trial may try (AIPerf's defaults in full.yaml)."""

    duration_minutes: float = 60.0
    """The run's length: no epoch ends after it counts (AIPerf: as long as the run lasts)."""
    epochs: tuple[int, ...] = (15, 30, 45, 60)
    """Epoch budgets of the first rounds of trials (a round: one trial a node), then the last one's."""
    hp_rounds: int = 2
    """Trainings of each architecture, each with hyperparameters from TPE (AIPerf's maxTPEsearchNum)."""
    dropout: tuple[float, float] = (0.0, 0.2)
    """The range TPE draws the dropout before the classifier from (uniform)."""
    kernel_sizes: tuple[int, ...] = (3, 5, 7)
    """The choices for the kernel of the late convolutions (AIPerf's `count > 175` layers)."""
    batch_sizes: tuple[int, ...] = (256,)
    """The choices for the batch size of a node (split over its ranks)."""
    exploration: float = 0.2
    """How often a child is morphed from a random finished architecture rather than the best one."""
    warm_start: bool = False
    """Children start from their parent's trained weights through the function-preserving
    morphism; AIPerf trains each trial from scratch (false)."""
    patience_base: int = 6
    """Early stopping after min(patience_base + 2 x round, 20) epochs without a better accuracy."""
    predict_epoch: int = 90
    """A trial reports the best of its accuracy and a log-curve fit extrapolated to this epoch ..."""
    predict_min_epochs: int = 10
    """... when it ran at least this many epochs (AIPerf: 10 to 79)."""

    def __post_init__(self) -> None:
        check_positive("search.duration_minutes", self.duration_minutes)
        if not self.epochs or any(e < 1 for e in self.epochs):
            raise ValueError(f"search.epochs={list(self.epochs)} must be epoch budgets of 1 or more")
        check_at_least("search.hp_rounds", self.hp_rounds, 1)
        low, high = self.dropout
        if not 0.0 <= low <= high < 1.0:
            raise ValueError(f"search.dropout={list(self.dropout)} must be [low, high] with 0 <= low <= high < 1")
        if not self.kernel_sizes or any(k < 1 or k % 2 == 0 or k > 15 for k in self.kernel_sizes):
            raise ValueError(f"search.kernel_sizes={list(self.kernel_sizes)} must be odd sizes 1 to 15")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"search.batch_sizes={list(self.batch_sizes)} must be positive")
        if not 0.0 <= self.exploration <= 1.0:
            raise ValueError(f"search.exploration={self.exploration} must be from 0 to 1")
        check_at_least("search.patience_base", self.patience_base, 1)


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """SGD with momentum and a cosine schedule over each trial's epochs."""

    base_learning_rate: float = 0.1
    """At base_batch_size; scaled linearly with the trial's batch size."""
    base_batch_size: int = 256
    momentum: float = 0.9
    weight_decay: float = 5e-5
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        check_positive("optimizer.base_learning_rate", self.base_learning_rate)
        check_at_least("optimizer.base_batch_size", self.base_batch_size, 1)


@dataclass(kw_only=True, frozen=True)
class ScoreConfig:
    """AIPerf's score: operations a second over windows; valid once the best accuracy reaches the threshold."""

    threshold: float = 0.70
    """Top-1 accuracy a valid run reaches (70 % on ImageNet in AIPerf's rules)."""
    first_window_hours: float = 0.2
    step_hours: float = 0.1
    train_images: int | None = None
    """Images an epoch's training counts; None: the dataset's. AIPerf's score.py counts 1,280,000
    (ImageNet has 1,281,167), so `full` sets it, for scores comparable with AIPerf's."""
    eval_images: int | None = None
    """Images an epoch's evaluation counts; None: the dataset's (AIPerf: 50,000)."""

    def __post_init__(self) -> None:
        for name in ("train_images", "eval_images"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"score.{name}={value} must be positive, or null for the dataset's count")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"score.threshold={self.threshold} must be an accuracy between 0 and 1")
        check_positive("score.first_window_hours", self.first_window_hours)
        check_positive("score.step_hours", self.step_hours)


@dataclass(kw_only=True, frozen=True)
class AIPerfConfig:
    data: DataConfig = field(default_factory=DataConfig)
    seed: SeedConfig = field(default_factory=SeedConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
