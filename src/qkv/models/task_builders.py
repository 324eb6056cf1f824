"""Task models: a classifier or regressor head on an encoder, for fine-tuning.

``build_task_model(config, task)`` builds a fresh :class:`~qkv.models.task_models.SequenceClassifier` or
:class:`~qkv.models.task_models.TokenClassifier` from a :class:`~qkv.config.ModelConfig`;
``attach_task_head(model, task)`` puts a task head on a loaded encoder, masked-LM or discriminator
model, copying its encoder's weights. Like :mod:`qkv.models.builders` (whose encoder builder and
BERT initialisation they use), these are builders: code that reads a config to make modules.
"""

from __future__ import annotations

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.nn.maps import TRAINING, LinearMaps
from qkv.models.builders import build_encoder, build_norm_for, init_weights
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig, TaskHead
from qkv.models.task_models import SequenceClassifier, TaskModel, TokenClassifier
from qkv.nn.encoder import Encoder
from qkv.models.discriminator import Discriminator
from qkv.models.mlm import MaskedLM

__all__ = ["build_task_model", "attach_task_head"]


def build_task_model(config: ModelConfig, task: TaskConfig, *, init: bool = True,
                     maps: LinearMaps = TRAINING) -> TaskModel:
    """The :class:`SequenceClassifier` (sequence classification, regression) or
    :class:`TokenClassifier` for ``task`` on the encoder described by ``config``
    (BERT-initialised unless ``init=False``; ``maps``: how the linear maps are made).

    A sequence task that pools with ``"pooler"`` needs the encoder's pooler: the model is built
    from ``config.replace(pooler=True)``, and its ``.config`` says so. A pooler the task does not
    use (token classification, pooling ``"cls"`` / ``"mean"``) is kept but frozen
    (``requires_grad=False``), as in :func:`build_masked_lm`. A task that names a ``head`` gets a
    :class:`~qkv.models.heads.TaskHead` (its dense map has a bias when ``config.head_bias``; its norm,
    with ``head_norm``, is the encoder's kind of norm).
    """
    if not isinstance(task, TaskConfig):
        raise ValueError(f"task must be a TaskConfig, got {type(task).__name__}")
    if task.is_sequence and task.pooling == "pooler" and not config.pooler:
        config = config.replace(pooler=True)
    encoder = build_encoder(config, init=False, maps=maps)
    classifier = maps.linear(config.d_model, task.num_labels)
    head = None
    if task.head is not None:
        head = TaskHead(maps.linear(config.d_model, config.d_model, bias=config.head_bias), task.head,
                        build_norm_for(config) if task.head_norm else None)
    cls = SequenceClassifier if task.is_sequence else TokenClassifier
    model = cls(encoder, task, classifier, config=config, head=head)
    if init:
        init_weights(model, config.initializer_range)
    if encoder.pooler is not None and not (task.is_sequence and task.pooling == "pooler"):
        encoder.pooler.requires_grad_(False)
    return model


def _same_head(old: TaskConfig, new: TaskConfig) -> bool:
    return (old.task == new.task and old.labels == new.labels and (old.head, old.head_norm) == (new.head, new.head_norm)
            and (not new.is_sequence or old.pooling == new.pooling))


def attach_task_head(model: nn.Module, task: TaskConfig, *, seed: int = 0, reset_head: bool = False) -> TaskModel:
    """A task model for fine-tuning ``model`` on ``task``.

    Args:
        model: a qkv model (``qkv.load(path).model``): an :class:`~qkv.nn.encoder.Encoder`, a
            :class:`~qkv.models.mlm.MaskedLM` or :class:`~qkv.models.discriminator.Discriminator`
            (its encoder is used, the pretraining head dropped), or
            a task model (:class:`SequenceClassifier` / :class:`TokenClassifier`).
        task: the head wanted.
        seed: seeds the initialisation of what is new (BERT's: normal(0, ``initializer_range``),
            zero bias): the classifier, and the pooler when ``task`` pools with ``"pooler"`` and
            the encoder has none (pooler first). Independent of the global RNG, which is left as
            it was.
        reset_head: replace an existing task head by a fresh one even when it differs from
            ``task``.

    Returns:
        A new model from :func:`build_task_model` (the input is not changed) with a copy of the
        encoder's weights, on the input's device and dtype, in its train/eval mode.
        An existing head whose task, labels (and pooling, for sequence tasks) equal ``task``'s is
        kept with its weights.

    Raises:
        CheckpointError: ``model`` has a different task head and ``reset_head`` is False.
        ValueError: ``model`` is not a qkv model with a ``.config``.
    """
    config = getattr(model, "config", None)
    if (not isinstance(model, (Encoder, MaskedLM, TaskModel, Discriminator))
            or not isinstance(config, ModelConfig)):
        hint = "; pass its .model (qkv.load(path).model)" if type(model).__name__ == "Pretrained" else ""
        raise ValueError("attach_task_head needs a qkv Encoder, MaskedLM or task model with a .config "
                         f"(from qkv.load or qkv.models.builders), got {type(model).__name__}{hint}")
    if not isinstance(task, TaskConfig):
        raise ValueError(f"task must be a TaskConfig, got {type(task).__name__}")
    encoder = model if isinstance(model, Encoder) else model.encoder
    keep = isinstance(model, TaskModel) and not reset_head
    if keep and not _same_head(model.task, task):
        raise CheckpointError(
            f"the model already has a task head ({model.task.describe()}) that differs from the one "
            f"asked for ({task.describe()}); pass reset_head=True (qkv finetune --reset-head) to replace "
            "it with a freshly initialised head")
    with torch.random.fork_rng(devices=[]):  # building draws from the global RNG: leave it as it was
        new = build_task_model(config, task, init=False)
    with torch.no_grad():
        missing, unexpected = new.encoder.load_state_dict(encoder.state_dict(), strict=False)
        if unexpected or not all(k.startswith("pooler.") for k in missing):  # config and encoder disagree
            raise ValueError(f"the model's encoder does not match its .config: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
        fresh = [new.encoder.pooler.dense] if missing else []
        if keep:
            new.classifier.load_state_dict(model.classifier.state_dict())
            if new.head is not None:
                new.head.load_state_dict(model.head.state_dict())
        else:
            fresh.append(new.classifier)
            if new.head is not None:
                fresh.append(new.head.dense)
        g = torch.Generator().manual_seed(seed)
        for linear in fresh:
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * config.initializer_range)
            if linear.bias is not None:
                linear.bias.zero_()
    ref = next(encoder.parameters())
    new.to(device=ref.device, dtype=ref.dtype)
    new.train(model.training)
    return new
