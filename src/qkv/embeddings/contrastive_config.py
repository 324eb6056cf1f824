"""What contrastive training of an embedding model depends on: :class:`ContrastiveConfig` (the
options of :func:`qkv.embeddings.contrastive.train_embeddings`, stored in ``run.json``; ``--resume``
refuses a different one) and the objectives it names (:data:`MODES`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.pooling import check_pooling
from qkv.training.config import RunConfig
from qkv.training.precision import PRECISIONS
from qkv.validation import (check_batch_tokens, check_choice, check_int, check_positive, check_range,
                            check_run_length)

__all__ = ["ContrastiveConfig", "MODES"]

#: The contrastive objectives: SimCSE (a text and its own second view under dropout) or supervised
#: pairs (texts of one label).
MODES = ("simcse", "supervised")


@dataclass(frozen=True)
class ContrastiveConfig(RunConfig):
    """Options of :func:`train_embeddings` (validated on construction).

    ``steps`` (or, with ``time_budget``, minutes of training: the learning rate reaches zero at the
    deadline) of ``batch_size`` documents; ``warmup`` is a fraction of ``steps``; ``precision``
    ``fp32``, ``bf16`` (fp32 with a message where the CPU has no native bf16) or ``auto``;
    ``log_every``: steps between the logged losses.
    """

    mode: str = "simcse"
    temperature: float = 0.05
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-5
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of the steps
    max_len: int = 128  # training window (tokens incl. [CLS]/[SEP])
    pooling: str = "mean"
    layers: tuple[int, ...] = (-1,)
    dropout: float | None = None  # None: the model's own (BERT: 0.1)
    seed: int = 0
    log_every: int = 10
    time_budget: float | None = None
    precision: str = "fp32"

    def __post_init__(self):
        check_choice("mode", self.mode, MODES, error=EmbeddingError)
        object.__setattr__(self, "pooling", check_pooling(self.pooling))  # "+"-joined form
        for name in ("steps", "batch_size", "log_every"):
            check_int(name, getattr(self, name), low=1, allow_bool=True, error=EmbeddingError)
        if self.batch_size < 2:
            raise EmbeddingError("batch_size must be ≥ 2: in-batch negatives need another document")
        if not self.temperature > 0 or not self.lr > 0:
            raise EmbeddingError(f"temperature ({self.temperature}) and lr ({self.lr}) must be > 0")
        check_range("warmup", self.warmup, 0, 1, noun="a fraction", error=EmbeddingError)
        check_range("dropout", self.dropout, 0, 1, optional=True, error=EmbeddingError)
        check_positive("time_budget", self.time_budget, unit=" of minutes (e.g. 5)", optional=True,
                       error=EmbeddingError)
        check_run_length(self, error=EmbeddingError)
        check_int("max_len", self.max_len, low=3, error=EmbeddingError)
        check_batch_tokens("batch_size", self.batch_size, self.max_len, error=EmbeddingError)
        check_choice("precision", self.precision, PRECISIONS, error=EmbeddingError)
        if self.mode == "simcse" and self.dropout == 0:
            raise EmbeddingError("SimCSE needs dropout > 0: the two views of a text differ only by dropout")

    def tokens_per_example(self, model=None) -> int:
        """A document's training window: ``max_len`` tokens."""
        return self.max_len

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layers": list(self.layers)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContrastiveConfig:
        cls.check_keys(data)
        return cls(**{**data, "layers": tuple(data.get("layers", (-1,)))})
