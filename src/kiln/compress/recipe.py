"""The records of a distillation run: its recipe (what decides the student's weights with the data), the loss
weights and one epoch's figures. Apart from the trainer, so that a run's arguments are checked, and its lineage read,
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import UsageError

CHECKPOINT = "last.pt"  # a run's per-epoch checkpoint, in distill.checkpoint_dir (what --resume reads)


@dataclass(frozen=True)
class LossWeights:
    alpha: float = 0.5  # share of cross-entropy on labels (logit tasks, labelled data only)
    temperature: float = 2.0
    hidden: float = 1.0  # hidden-state matching (embedding tasks)
    embedding: float = 1.0  # cosine between sentence embeddings (embedding tasks)


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the student's final weights (with the data): recorded in its lineage."""

    keep: tuple[int, ...]  # teacher layers the student starts from
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-4  # on MiniLM, 1 epoch: mean cosine 0.892 at 1e-4, 0.925 at 5e-4, 0.927 at 1e-3
    max_length: int = 128  # features are cut here while training (the student serves the teacher's maximum)
    seed: int = 0
    warmup: float = 0.1  # share of the steps with a rising learning rate
    weight_decay: float = 0.01
    patience: int = 2  # epochs without a better held-out agreement before stopping
    weights: LossWeights = field(default_factory=LossWeights)

    def __post_init__(self) -> None:
        for flag, value, low in (("epochs", self.epochs, 0), ("batch_size", self.batch_size, 1),
                                 ("max_length", self.max_length, 8), ("patience", self.patience, 1)):
            if value < low:
                raise UsageError(f"{flag} must be at least {low} (got {value})")
        if not self.lr > 0:
            raise UsageError(f"lr must be positive (got {self.lr})")
        if not 0 <= self.weights.alpha <= 1:
            raise UsageError(f"alpha must be between 0 and 1 (got {self.weights.alpha})")
        if not self.weights.temperature > 0:
            raise UsageError(f"temperature must be positive (got {self.weights.temperature})")


@dataclass(frozen=True)
class Epoch:
    epoch: int
    loss: float
    agreement: float  # the task's gated agreement figure on the held-out split
    figures: dict[str, float]
    seconds: float
    steps: int
