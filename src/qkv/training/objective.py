"""What a training run learns: the :class:`Objective` protocol the engine
(:func:`qkv.training.engine.run_training`) trains, and the helpers objectives share.

An objective is a loss and a batch source — nothing else is needed to get time budgets, bf16,
checkpoints, bit-identical ``--resume``, locks, progress bars, ``metrics.jsonl`` and torchrun from
the engine. qkv's own: masked LM (:class:`qkv.training.loop.MaskedLMObjective`), causal LM
(:class:`qkv.training.clm.CausalLMObjective`), task heads (:class:`qkv.finetune.run.TaskObjective`),
sequence-to-sequence (:class:`qkv.lab.seq2seq.Seq2SeqObjective`), contrastive pairs
(:class:`qkv.embeddings.contrastive.ContrastiveObjective`) and the lab's synthetic encoder tasks
(:class:`qkv.lab.encoder_run.SyntheticTaskObjective`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch

from qkv.data.model_tokenizer import ModelTokenizer
from qkv.data.special_tokens import read_declared
from qkv.data.tokenizer_facade import read_tokenizer
from qkv.checkpoints.io import save

__all__ = ["Objective", "save_final_model", "move_batch"]


class Objective(Protocol):
    """What a training run learns and how it is scored.

    Required: ``batch(i)`` is micro-batch ``i`` of this rank — a pure function of ``i`` (resumption
    depends on it); the engine moves it to the device (:func:`move_batch`). ``loss(model, b)`` is
    the mean loss of batch ``b`` (a 0-d tensor).

    Optional (the engine's default when absent): ``units(b)`` the number of things the loss averages
    over (masked tokens, examples, labelled tokens) as a 0-d tensor (1: every micro-batch weighs the
    same); ``evaluate(model)`` the held-out figures, ``eval_loss`` and :attr:`metric` among them,
    all ranks together (``{}``); ``describe(ev)`` one line of them; ``save(model, out)`` writes the
    final model into the run folder (nothing); ``metric``, ``metric_label``, ``loss_label`` name
    the curve's figures; ``rate_unit`` and ``rate_count(b)`` what the logged rate counts
    (``metrics.jsonl``'s ``{rate_unit}_per_s``; default ``tokens``: the real tokens of the batch's
    ``attention_mask``) — image classification counts ``images``.
    """

    def batch(self, index: int) -> Any: ...
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor: ...


def save_final_model(model: torch.nn.Module, out: Path) -> None:
    """Write the trained ``model`` into run folder ``out`` with the run's tokenizer, so that
    ``qkv.load(out)`` loads it (what an objective's ``save`` usually is)."""
    tokenizer = ModelTokenizer(read_tokenizer(Path(out) / "tokenizer.json"), read_declared(out))
    save(model, out, tokenizer=tokenizer)


def move_batch(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``: its ``to(device)``, or a dataclass with its tensor fields moved.

    To a GPU, a dataclass's CPU tensors go through pinned (page-locked) memory and are copied
    without blocking the host (``non_blocking=True``): the copy overlaps the work queued before it.
    """
    if device.type == "cuda" and dataclasses.is_dataclass(batch):
        return dataclasses.replace(batch, **{f.name: _to_gpu(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch)
                                             if isinstance(getattr(batch, f.name), torch.Tensor)})
    if hasattr(batch, "to"):
        return batch.to(device)
    if dataclasses.is_dataclass(batch) and device.type != "cpu":
        return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).to(device)
                                             for f in dataclasses.fields(batch)
                                             if isinstance(getattr(batch, f.name), torch.Tensor)})
    return batch


def _to_gpu(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
