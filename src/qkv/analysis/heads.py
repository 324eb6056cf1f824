"""Per-head attention statistics (Clark et al., 2019, "What Does BERT Look At?").

Legend: L layers, B contexts, H heads, T query length, S key length (= T), N real queries.

For every layer × head, averaged over all real (non-padding) query tokens of the corpus:

* ``entropy`` — of the query's attention distribution, in nats: 0 when it attends to one token,
  ``log S`` when it attends uniformly to S real tokens.
* ``distance`` — attended distance ``Σ_j a_ij |i - j|`` in tokens.
* ``cls_share``, ``sep_share`` — attention mass on ``[CLS]`` / on ``[SEP]`` tokens.
* ``self_share`` — mass on the query token itself.
* ``prev_share`` / ``next_share`` — mass on the previous / next token, averaged over the queries
  that have a real previous / next token.

Padding is excluded everywhere: padded queries are not counted, and the uniform baselines use the
number of real keys. The attention weights themselves come from the model, which already gives
(near) zero weight to padded keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

__all__ = ["HeadStats", "HeadAccumulator", "head_statistics", "HEAD_METRICS"]

HEAD_METRICS = ("entropy", "distance", "cls_share", "sep_share", "self_share", "prev_share", "next_share")


@dataclass
class HeadStats:
    """Head statistics: each metric an ``(L,H)`` array (see the module docstring).

    Attributes:
        uniform_entropy: mean ``log S`` over queries — the entropy uniform attention would have.
        uniform_distance: mean attended distance under uniform attention over real keys.
        n_queries: number of real query tokens averaged over.
    """

    entropy: np.ndarray
    distance: np.ndarray
    cls_share: np.ndarray
    sep_share: np.ndarray
    self_share: np.ndarray
    prev_share: np.ndarray
    next_share: np.ndarray
    uniform_entropy: float
    uniform_distance: float
    n_queries: int

    @property
    def n_layers(self) -> int:
        return self.entropy.shape[0]

    @property
    def n_heads(self) -> int:
        return self.entropy.shape[1]

    def metric(self, name: str) -> np.ndarray:
        if name not in HEAD_METRICS:
            raise KeyError(f"unknown head metric {name!r}; allowed: {', '.join(HEAD_METRICS)}")
        return getattr(self, name)

    def to_dict(self) -> dict:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in asdict(self).items()}


class HeadAccumulator:
    """Running sums of the head statistics over batches; :meth:`result` gives :class:`HeadStats`."""

    def __init__(self, cls_id: int, sep_id: int) -> None:
        self.cls_id, self.sep_id = cls_id, sep_id
        self.sums: dict[str, np.ndarray] = {}
        self.counts = {"all": 0, "prev": 0, "next": 0}
        self.uniform_entropy_sum = 0.0
        self.uniform_distance_sum = 0.0

    def update(self, attentions, mask, input_ids) -> None:
        """Add one batch.

        Args:
            attentions: ``(L,B,H,T,T)`` weights (NumPy or torch).
            mask: ``(B,T)`` bool, True at real tokens.
            input_ids: ``(B,T)`` token ids (to find ``[CLS]`` and ``[SEP]``).
        """
        attn = torch.as_tensor(attentions, dtype=torch.float32)
        m = torch.as_tensor(mask, dtype=torch.bool)
        ids = torch.as_tensor(input_ids)
        n_layers, b, _, t, s = attn.shape
        if t != s or m.shape != (b, t) or ids.shape != (b, t):
            raise ValueError(
                f"attentions (L,B,H,T,T) = {tuple(attn.shape)}, mask {tuple(m.shape)} and input_ids "
                f"{tuple(ids.shape)} disagree; expected mask and input_ids of shape ({b}, {t})"
            )
        q = m.float()[:, None, :]  # (B,1,T) real queries
        q_prev = (m[:, 1:] & m[:, :-1]).float()[:, None, :]  # (B,1,T-1) queries 1..T-1 with a real previous
        q_next = (m[:, :-1] & m[:, 1:]).float()[:, None, :]  # (B,1,T-1) queries 0..T-2 with a real next
        special = torch.stack([ids == self.cls_id, ids == self.sep_id], -1).float()[:, None]  # (B,1,S,2)
        pos = torch.arange(t, dtype=torch.float32)
        dist = (pos[:, None] - pos[None, :]).abs()  # (T,S)
        rows = {name: [] for name in HEAD_METRICS}
        for layer in range(n_layers):
            a = attn[layer]  # (B,H,T,S)
            shares = a @ special  # (B,H,T,S)@(B,1,S,2) -> (B,H,T,2): mass on [CLS], on [SEP]
            per_query = {
                "entropy": -torch.special.xlogy(a, a).sum(-1),  # (B,H,T)
                "distance": torch.einsum("bhts,ts->bht", a, dist),  # Σ_j a_ij |i-j|: (B,H,T)
                "cls_share": shares[..., 0],
                "sep_share": shares[..., 1],
                "self_share": torch.diagonal(a, dim1=-2, dim2=-1),  # (B,H,T)
            }
            for name, v in per_query.items():
                rows[name].append((v * q).sum(dim=(0, 2)))  # (B,H,T)*(B,1,T) -> (H,)
            prev = torch.diagonal(a, offset=-1, dim1=-2, dim2=-1)  # a[i+1, i]: (B,H,T-1)
            nxt = torch.diagonal(a, offset=1, dim1=-2, dim2=-1)  # a[i, i+1]: (B,H,T-1)
            rows["prev_share"].append((prev * q_prev).sum(dim=(0, 2)))  # (H,)
            rows["next_share"].append((nxt * q_next).sum(dim=(0, 2)))
        for name, vals in rows.items():
            arr = torch.stack(vals).double().numpy()  # L × (H,) -> (L,H)
            self.sums[name] = self.sums.get(name, 0) + arr
        self.counts["all"] += int(m.sum())
        self.counts["prev"] += int(q_prev.sum())
        self.counts["next"] += int(q_next.sum())
        n_real = m.sum(-1).double()  # (B,)
        self.uniform_entropy_sum += float((torch.log(n_real.clamp_min(1)) * n_real).sum())
        mf = m.double()  # (B,T)
        mean_dist = (mf @ dist.double()) / n_real.clamp_min(1)[:, None]  # (B,T): mean |i-j| over real j
        self.uniform_distance_sum += float((mean_dist * mf).sum())

    def result(self) -> HeadStats:
        if self.counts["all"] == 0:
            raise ValueError("no attention was accumulated (no real query tokens)")
        out = {}
        for name in HEAD_METRICS:
            key = {"prev_share": "prev", "next_share": "next"}.get(name, "all")
            out[name] = self.sums[name] / max(self.counts[key], 1)
        n = self.counts["all"]
        return HeadStats(
            **out,
            uniform_entropy=self.uniform_entropy_sum / n,
            uniform_distance=self.uniform_distance_sum / n,
            n_queries=n,
        )


def head_statistics(attentions, mask, input_ids, *, cls_id: int, sep_id: int) -> HeadStats:
    """Head statistics of one batch of attention maps ``(L,B,H,T,T)`` (see the module docstring)."""
    acc = HeadAccumulator(cls_id, sep_id)
    acc.update(attentions, mask, input_ids)
    return acc.result()
