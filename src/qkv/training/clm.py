"""The causal-LM objective: next-token prediction on the same packed blocks as masked-LM pretraining.

``qkv pretrain --objective clm`` trains a :class:`~qkv.models.causal_lm.CausalLM` on the blocks as
they are — no masking —, scoring every position against the next token
(:func:`qkv.data.pipeline.clm_labels`: not padding, not the closing ``[SEP]`` of a block). Held out:
loss, perplexity and next-token accuracy over the same tokens every time, beside the unigram and
bigram perplexities of those tokens (:mod:`qkv.training.baselines`), estimated once from the
training blocks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from qkv.data.masking import IGNORE_INDEX
from qkv.models.causal_lm import shift_labels
from qkv.training.distributed import all_sum
from qkv.training.objective import save_final_model

__all__ = ["CausalLMObjective", "evaluate_clm"]


@torch.no_grad()
def evaluate_clm(model: torch.nn.Module, batches, *, device: torch.device, max_batches: int) -> dict:
    """Next-token loss, perplexity and accuracy over held-out batches (all ranks together)."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    for i, batch in enumerate(batches.epoch()):
        if i >= max_batches:
            break
        batch = batch.to(device)
        out = model(batch.input_ids, batch.attention_mask, labels=batch.labels)
        targets = shift_labels(batch.labels)
        targets = targets[targets != IGNORE_INDEX]  # (N,) in the order of the sparse logits
        n = targets.numel()
        if n:
            totals += torch.stack([out.loss.double().cpu() * n,
                                   (out.logits.argmax(-1) == targets).sum().double().cpu(),
                                   torch.tensor(float(n), dtype=torch.float64)])
    model.train(was_training)
    totals = all_sum(totals)
    loss = (totals[0] / totals[2]).item() if totals[2] else float("nan")
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "accuracy": (totals[1] / totals[2]).item() if totals[2] else float("nan"),
            "scored_tokens": int(totals[2].item())}


class CausalLMObjective:
    """Next-token prediction; held-out figures with the count baselines beside them.

    Args:
        batches, eval_batches: :class:`~qkv.data.pipeline.CLMBatches` for training and held out.
        device: where batches go. max_eval_batches: held-out batches per evaluation (per rank).
        baselines: ``{"unigram_perplexity", "bigram_perplexity", …}`` of the held-out tokens
            evaluated (:func:`qkv.training.baselines.baseline_perplexities`), added to every
            evaluation.
    """

    metric, metric_label, loss_label = "accuracy", "next-token accuracy", "CLM loss"

    def __init__(self, batches, eval_batches, device: torch.device, max_eval_batches: int, baselines: dict):
        self.batches, self.eval_batches = batches, eval_batches
        self.device, self.max_eval_batches, self.baselines = device, max_eval_batches, baselines

    def batch(self, index: int):
        return self.batches.batch(index)

    def units(self, batch) -> torch.Tensor:
        return (shift_labels(batch.labels) != IGNORE_INDEX).sum()

    def loss(self, model, batch) -> torch.Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def evaluate(self, model) -> dict:
        ev = evaluate_clm(model, self.eval_batches, device=self.device, max_batches=self.max_eval_batches)
        return {**ev, **self.baselines}

    def describe(self, ev: dict) -> str:
        return (f"held-out loss {ev['eval_loss']:.4f}, perplexity {ev['perplexity']:.1f} (bigram "
                f"{ev['bigram_perplexity']:.1f}, unigram {ev['unigram_perplexity']:.1f}), next-token accuracy "
                f"{ev['accuracy']:.4f}")

    def save(self, model, out: Path) -> None:
        save_final_model(model, out)


def eval_block_indices(n_blocks: int, eval_batches: int, global_eval_batch: int) -> np.ndarray:
    """The held-out blocks an evaluation reads: the first ``eval_batches`` global batches, in order
    (what every rank's :meth:`CLMBatches.epoch` covers together)."""
    return np.arange(min(n_blocks, eval_batches * global_eval_batch))
