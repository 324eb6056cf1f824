"""Is a run's state worth a checkpoint? A finite training loss can still take an update that overflows
(say ``--lr 1e30``): weights that are not finite, or whose held-out loss is not, are no checkpoint to
resume from and no model to finish with. The engine asks :func:`unhealthy` before each checkpoint."""

from __future__ import annotations

import math

import torch

from qkv.training import distributed as qdist

__all__ = ["unhealthy"]


def unhealthy(model: torch.nn.Module, final_eval: dict | None, collective: bool) -> str | None:
    """What is wrong with ``model`` and its last held-out evaluation, or ``None`` when nothing is.

    ``collective`` (every process saves, each its shard): each checks its own shard (``to_local``) and all
    agree through one sum, on the weights' device as the process group needs; else the weights are whole
    (one process, or DDP's replicas: only rank 0 saves) and are checked here alone.
    """
    ev = final_eval or {}
    eval_loss, counted = ev.get("eval_loss"), all(ev.get(k) != 0 for k in ("masked_tokens", "examples", "tokens"))
    if isinstance(eval_loss, float) and not math.isfinite(eval_loss) and counted:  # (0/0 when nothing counted)
        return f"held-out loss {eval_loss}"
    local = [getattr(t, "to_local", lambda t=t: t)() for t in model.parameters()]  # a DTensor's shard
    bad = float(not all(bool(t.isfinite().all()) for t in local))
    if collective:
        device = local[0].device if local else torch.device("cpu")
        bad = qdist.all_sum(torch.tensor(bad, device=device)).item()
    return "non-finite weights" if bad > 0 else None
