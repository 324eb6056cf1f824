"""What ``qkv inspect`` shows beside the raw attention of one text: value-norm weighted attention,
rollout and flow per layer, and what switching off each head does to the model's output.

Legend: L layers, H heads, T tokens, C width.

* ``value_norm``: ``(L,H,T,T)`` ``‖α_hij f_h(x_j)‖`` (Kobayashi et al. 2020), each row divided by its
  sum for display, so that it reads as a share like the attention weights;
* ``rollout``: ``(L,T,T)``, row i of layer ℓ = the rollout through layers 0 … ℓ (Abnar & Zuidema 2020);
* ``flow``: ``(L,T,T)``, the max flow through layers 0 … ℓ, rows normalised as the authors' code does;
  T² max-flow problems per layer, so texts longer than ``flow_max_tokens`` go without it (a note
  says so);
* token importance (a sequence classifier): how much each token matters to the predicted class's
  probability — blank-out (the token replaced by ``[UNK]``), input × gradient and integrated
  gradients (the non-attention baselines), beside the ``[CLS]`` rows of rollout and flow;
* head ablation: every head zero-ablated alone; for a sequence classifier the change in the
  probability of the class it predicts, else the relative change of the last hidden states
  (mean over tokens of ``‖h' − h‖ / ‖h‖``).

Value norms and ablation read the model through hooks (a qkv model); rollout and flow need only the
attention weights (any model).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from qkv.analysis.attribution import attention_flow, attention_rollout, value_norm_weights
from qkv.analysis.hooked import Batch, call, layer_paths, run_with_cache
from qkv.analysis.interventions import ablated
from qkv.analysis.saliency import class_probability, input_x_gradient, integrated_gradients, leave_one_out
from qkv.models.kinds import encoder_of
from qkv.models.task_models import SequenceClassifier

__all__ = ["METHODS", "METHOD_TITLES", "method_maps", "ablation_scan", "is_qkv", "is_classifier", "token_importance"]

#: The views of a text's attention, in the viewer's order.
METHODS = ("raw", "value_norm", "rollout", "flow")
METHOD_TITLES = {"raw": "raw attention", "value_norm": "value-norm weighted (‖αf(x)‖, rows as shares)",
                 "rollout": "attention rollout (through layers 0…ℓ)", "flow": "attention flow (through layers 0…ℓ)"}


def is_qkv(model: nn.Module) -> bool:
    try:
        encoder_of(model)
    except ValueError:
        return False
    return True


def is_classifier(model: nn.Module) -> bool:
    """A qkv sequence classifier (its output has ``logits (B,K)`` over classes)."""
    return isinstance(model, SequenceClassifier) and model.task.task == "sequence-classification"


def token_importance(model: nn.Module, batch: Batch, *, replacement_id: int, maps: dict[str, np.ndarray] | None = None,
                     steps: int = 16) -> tuple[dict[str, np.ndarray], str]:
    """Each token's importance ``(T,)`` to the predicted class's probability of one text, by blank-out,
    input × gradient and integrated gradients (``steps`` steps), and by the ``[CLS]`` row of the last
    layer's rollout and flow when ``maps`` has them; and what they measure."""
    with torch.no_grad():
        probs = call(model, batch).logits.softmax(-1)  # (1,K)
    k = probs.argmax(-1)  # (1,)
    target = class_probability(k)
    out = {"blank-out": leave_one_out(model, batch, target, replacement_id=replacement_id)[0].double().numpy(),
           "input × gradient": input_x_gradient(model, batch, target)[0].double().numpy(),
           "integrated gradients": integrated_gradients(model, batch, target, steps=steps).scores[0].double().numpy()}
    for m in ("rollout", "flow"):
        if maps and m in maps:
            out[f"{m} ([CLS] row)"] = np.asarray(maps[m][-1, 0], dtype=np.float64)  # (L,T,T) -> last layer, row 0
    label = model.task.labels[int(k[0])]
    return out, f"the probability of the predicted class {label!r} ({float(probs[0, k[0]]):.3f})"


def _value_norm_maps(model: nn.Module, batch: Batch) -> np.ndarray:
    """``(L,H,T,T)`` per-head value norms, rows divided by their sums."""
    paths = layer_paths(model)
    with torch.no_grad():
        _, kept = run_with_cache(model, batch, [f"{p}.attention.{x}" for p in paths for x in ("weights", "v")])
    maps = []
    for p, layer in zip(paths, encoder_of(model).layers):
        proj = layer.attention.out_proj
        vn = value_norm_weights(kept[f"{p}.attention.weights"], kept[f"{p}.attention.v"],
                                None if proj is None else proj.weight, summed=False)
        rows = vn.per_head[0]  # (H,T,T)
        maps.append((rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)).numpy())
    return np.stack(maps)


def method_maps(model: nn.Module, attentions: np.ndarray, batch: Batch, methods=METHODS, *,
                flow_max_tokens: int = 48) -> tuple[dict[str, np.ndarray], list[str]]:
    """The maps of ``methods`` for one text (``attentions (L,H,T,T)``, ``batch`` of that one text), and notes
    saying why any method is missing."""
    maps, notes = {}, []
    L, H, T, _ = attentions.shape
    weights = torch.from_numpy(attentions)[:, None]  # (L,1,H,T,T)
    for method in methods:
        if method == "value_norm":
            if not is_qkv(model):
                notes.append("value-norm: needs a qkv model (load the folder with qkv.load)")
                continue
            maps[method] = _value_norm_maps(model, batch)
        elif method == "rollout":
            maps[method] = attention_rollout(weights, all_layers=True)[:, 0].numpy()  # (L,T,T)
        elif method == "flow":
            if T > flow_max_tokens:
                notes.append(f"flow: not computed for {T} tokens (more than {flow_max_tokens}: {T}² max-flow problems "
                             f"per layer); qkv inspect --flow-max-tokens {T} computes it")
                continue
            maps[method] = attention_flow(weights, all_layers=True, normalize=True)[:, 0].numpy()  # (L,T,T)
        elif method != "raw":
            raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    return maps, notes


@torch.no_grad()
def ablation_scan(model: nn.Module, batch: Batch) -> tuple[np.ndarray, str]:
    """Every head zero-ablated alone on ``batch``: ``(L,H)`` mean changes and what they measure."""
    L, H = len(layer_paths(model)), encoder_of(model).layers[0].attention.n_heads
    out = np.zeros((L, H))
    rows = torch.arange(len(batch))
    if is_classifier(model):
        probs = call(model, batch).logits.softmax(-1)  # (B,K)
        k = probs.argmax(-1)  # (B,)
        for layer in range(L):
            for head in range(H):
                with ablated(model, [(layer, head)]):
                    out[layer, head] = float((call(model, batch).logits.softmax(-1)[rows, k] - probs[rows, k]).mean())
        if len(batch) == 1:
            return out, (f"change in the probability of the predicted class {model.task.labels[int(k[0])]!r} "
                         f"({float(probs[0, k[0]]):.3f})")
        return out, f"change in the probability of the predicted class, mean over {len(batch)} texts"
    stack, mask = encoder_of(model), batch.attention_mask
    base = stack(batch.input_ids, mask, batch.token_type_ids).last_hidden_state  # (B,T,C)
    for layer in range(L):
        for head in range(H):
            with ablated(model, [(layer, head)]):
                h = stack(batch.input_ids, mask, batch.token_type_ids).last_hidden_state
            change = (h - base).norm(dim=-1) / base.norm(dim=-1).clamp_min(1e-12)  # (B,T)
            out[layer, head] = float(change[mask].mean())
    return out, "relative change of the last hidden states, mean over tokens of ‖h′ − h‖ / ‖h‖"
