"""Masked-LM pretraining: config, the explicit loop, optimiser/schedule, checkpoints, distributed."""

from qkv.training.config import TrainConfig
from qkv.training.loop import PretrainResult, TrainingError, pretrain

__all__ = ["TrainConfig", "pretrain", "PretrainResult", "TrainingError"]
