"""Which token pairs make two texts' embeddings similar: a token-by-token map whose sum is the cosine.

Legend: Ta, Tb tokens of the two texts, C width, K pooling modes.

An embedding is a pooling of the (chosen layers') token vectors, ``e = pool(h_1 … h_n)``, and the
cosine ``e_a · e_b / (‖e_a‖ ‖e_b‖)`` splits exactly over token pairs:

* a linear pooling — ``mean`` (w_i = 1/n), ``mean_sqrt_len`` (1/√n), ``weightedmean`` (i / Σ i),
  ``cls`` (the first token), ``lasttoken`` (the last) — is ``e = Σ_i w_i h_i``, so
  ``e_a · e_b = Σ_ij (w_i h^a_i) · (w_j h^b_j)``: pair (i, j) contributes its term;
* ``max`` takes coordinate c from one token, i*(c), so coordinate c's product goes to the pair
  (i*_a(c), i*_b(c));
* several modes concatenated (``cls+mean``) add their pairs.

Dividing by ``‖e_a‖ ‖e_b‖`` gives contributions that sum to the cosine (whether or not the model
normalises its vectors: the cosine is the same). Each text must fit one window: the embedder
averages the windows of a longer text, which would need a map per pair of windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qkv.analysis.inputs import AnalysisInputError
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.pooling import pooling_modes, select_layers

__all__ = ["SimilarityMap", "explain_similarity"]


@dataclass
class SimilarityMap:
    """Contributions of every token pair of two texts to their embeddings' cosine.

    Attributes:
        tokens_a, tokens_b: the tokens of each window (``[CLS]`` … ``[SEP]``).
        contributions: ``(Ta,Tb)``; ``contributions.sum()`` is ``cosine``.
        cosine: the cosine of the two embeddings, as the embedder computes them.
        pooling, layers: the embedding settings used (the model folder's, unless given).
    """

    tokens_a: list[str]
    tokens_b: list[str]
    contributions: np.ndarray
    cosine: float
    pooling: str
    layers: tuple[int, ...]

    def top_pairs(self, k: int = 5) -> list[tuple[str, str, float]]:
        """The ``k`` pairs that add most to the cosine: ``(token a, token b, contribution)``."""
        c = self.contributions
        order = np.argsort(-c, axis=None)[:k]
        return [(self.tokens_a[i // c.shape[1]], self.tokens_b[i % c.shape[1]], float(c.flat[i])) for i in order]

    def to_dict(self) -> dict:
        return {"tokens_a": self.tokens_a, "tokens_b": self.tokens_b, "cosine": self.cosine,
                "sum_of_contributions": float(self.contributions.sum()), "pooling": self.pooling,
                "layers": list(self.layers), "contributions": self.contributions.round(6).tolist()}


def _weights(mode: str, n: int) -> np.ndarray:
    """Token weights ``(n,)`` of a linear pooling mode."""
    w = np.zeros(n)
    if mode == "mean":
        w[:] = 1.0 / n
    elif mode == "mean_sqrt_len":
        w[:] = 1.0 / np.sqrt(n)
    elif mode == "weightedmean":
        w[:] = np.arange(1, n + 1) / (n * (n + 1) / 2)
    elif mode == "cls":
        w[0] = 1.0
    else:  # lasttoken
        w[-1] = 1.0
    return w


def _pair_products(mode: str, ha: np.ndarray, hb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mode ``mode``'s pooled vectors ``e_a (C,)``, ``e_b (C,)`` and their dot product split over pairs ``(Ta,Tb)``."""
    if mode == "max":
        ia, ib = ha.argmax(0), hb.argmax(0)  # (C,) the token each coordinate comes from
        ea, eb = ha.max(0), hb.max(0)
        pairs = np.zeros((len(ha), len(hb)))
        np.add.at(pairs, (ia, ib), ea * eb)
        return ea, eb, pairs
    ua = _weights(mode, len(ha))[:, None] * ha  # (Ta,C) weighted token vectors
    ub = _weights(mode, len(hb))[:, None] * hb
    return ua.sum(0), ub.sum(0), ua @ ub.T  # (Ta,C)(C,Tb) -> (Ta,Tb)


def explain_similarity(model_or_path, text_a: str, text_b: str, *, tokenizer=None, **options) -> SimilarityMap:
    """The token-pair map of ``text_a`` and ``text_b``'s embedding cosine (see the module docstring).

    Args:
        model_or_path: what :class:`~qkv.embeddings.embedder.Embedder` takes (a folder, ``qkv.load``'s result).
        tokenizer: as for the embedder.
        **options: embedding options (``pooling``, ``layers``, ``max_len``); unset ones come from the folder.

    Raises:
        AnalysisInputError: an empty text, or one longer than the embedder's window.
    """
    emb = Embedder(model_or_path, tokenizer=tokenizer, **options)
    tok, encoder = emb.tokenizer, emb.encoder
    hidden, tokens = [], []
    for name, text in (("a", text_a), ("b", text_b)):
        ids = tok.encode([text])[0].tolist()
        if not ids:
            raise AnalysisInputError(f"text {name} is empty: it gives no tokens")
        if len(ids) + 2 > emb.window:
            raise AnalysisInputError(f"text {name} has {len(ids) + 2} tokens with [CLS] and [SEP], more than the "
                                     f"embedding window of {emb.window}; explaining a similarity needs each text in "
                                     "one window: shorten it")
        row = torch.tensor([[tok.cls_id, *ids, tok.sep_id]], device=emb.device)  # (1,T)
        with torch.no_grad():
            out = encoder(row, torch.ones_like(row, dtype=torch.bool), output_hidden_states=True)
        hidden.append(select_layers(out.hidden_states, emb.layers)[0].double().cpu().numpy())  # (T,C)
        tokens.append([tok.id_to_token(i) for i in row[0].tolist()])
    parts = [_pair_products(mode, hidden[0], hidden[1]) for mode in pooling_modes(emb.pooling)]
    ea = np.concatenate([p[0] for p in parts])
    eb = np.concatenate([p[1] for p in parts])
    scale = np.linalg.norm(ea) * np.linalg.norm(eb)
    if scale == 0:
        raise AnalysisInputError("an embedding is the zero vector: its cosine is undefined")
    contributions = sum(p[2] for p in parts) / scale
    return SimilarityMap(tokens[0], tokens[1], contributions, float(ea @ eb / scale), emb.pooling, emb.layers)
