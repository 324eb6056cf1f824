"""Models built from a :class:`~qkv.config.ModelConfig`: builders, the masked-LM model, task models
(sequence classification, regression, token classification), ELECTRA's discriminator, checkpoint
folders in and out (qkv and Hugging Face BERT, RoBERTa, DistilBERT, ELECTRA: :mod:`qkv.models.families`)."""

from qkv.models.builders import (build_causal_lm, build_discriminator, build_encoder, build_masked_lm, build_model,
                                 init_weights)
from qkv.models.discriminator import Discriminator, DiscriminatorOutput
from qkv.models.errors import CheckpointError
from qkv.models.heads import (POOLINGS, TASKS, SequenceClassifier, TaskConfig, TaskModel, TaskOutput,
                              TokenClassifier)
from qkv.models.io import Pretrained, convert, export_hf, load, save
from qkv.models.causal_lm import CausalLM, CausalLMOutput
from qkv.models.mlm import MaskedLM, MaskedLMHead, MaskedLMOutput
from qkv.models.task_builders import attach_task_head, build_task_model

__all__ = [
    "build_encoder",
    "build_masked_lm",
    "build_causal_lm",
    "CausalLM",
    "CausalLMOutput",
    "build_model",
    "build_task_model",
    "build_discriminator",
    "Discriminator",
    "DiscriminatorOutput",
    "attach_task_head",
    "init_weights",
    "CheckpointError",
    "convert",
    "export_hf",
    "load",
    "Pretrained",
    "save",
    "MaskedLM",
    "MaskedLMHead",
    "MaskedLMOutput",
    "TASKS",
    "POOLINGS",
    "TaskConfig",
    "TaskOutput",
    "TaskModel",
    "SequenceClassifier",
    "TokenClassifier",
]
