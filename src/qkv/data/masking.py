"""Dynamic masking for masked-language-model pretraining (BERT, with RoBERTa's dynamic masks).

Legend: B batch, T block length.

Every call draws a new mask: each non-special token is *selected* with probability ``select_rate``
(0.15); a selected token becomes ``[MASK]`` with probability ``mask_rate`` (0.8), a random
non-special token with probability ``random_rate`` (0.1), and stays unchanged otherwise (0.1).
Labels hold the original id at selected positions and -100 (ignored by ``cross_entropy``) elsewhere.
Special tokens — ``[PAD] [UNK] [CLS] [SEP] [MASK]`` — are never selected and never drawn as the
random replacement.

Whole-word masking (``whole_word=True``) selects *words*: a word is a token with ``word_starts``
True plus the continuation pieces after it, and its pieces are selected all together or not at all
(each word with probability ``select_rate``, so the expected selected fraction of tokens stays
``select_rate``); the 80/10/10 choice is then made per token, as in BERT's whole-word release.

Randomness comes from a ``torch.Generator`` — one for the whole batch, or one per row. Per-row
generators seeded from global sample positions (:func:`position_generators`) make a row's mask
independent of how rows are grouped into batches and processes, and different every epoch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkv.data.tokenizer import SpecialTokens
from qkv.validation import check_range

__all__ = ["MaskingConfig", "mask_tokens", "position_generators", "IGNORE_INDEX"]

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingConfig:
    """Masking rates; ``1 - mask_rate - random_rate`` of the selected tokens stay unchanged."""

    select_rate: float = 0.15
    mask_rate: float = 0.8
    random_rate: float = 0.1
    whole_word: bool = False

    def __post_init__(self) -> None:
        for name in ("select_rate", "mask_rate", "random_rate"):
            check_range(name, getattr(self, name), 0.0, 1.0, bounds="[]", number=True)
        if self.mask_rate + self.random_rate > 1.0 + 1e-12:
            raise ValueError(
                f"mask_rate + random_rate must be ≤ 1, got {self.mask_rate} + {self.random_rate}")


@functools.lru_cache(maxsize=16)
def _replacement_ids(vocab_size: int, special: tuple[int, ...]) -> Tensor:
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[[s for s in special if 0 <= s < vocab_size]] = False
    return keep.nonzero().squeeze(1)  # (V',) non-special ids


def _draw(gen: torch.Generator | Sequence[torch.Generator] | None, B: int, T: int,
          n_ids: int) -> tuple[Tensor, Tensor, Tensor]:
    """Uniforms for selection and action, and replacement indices, each ``(B,T)`` on the CPU."""
    if gen is None or isinstance(gen, torch.Generator):
        u = torch.rand((2, B, T), generator=gen)  # (2,B,T)
        r = torch.randint(n_ids, (B, T), generator=gen)  # (B,T)
        return u[0], u[1], r
    if len(gen) != B:
        raise ValueError(f"need one generator per row: got {len(gen)} generators for {B} rows")
    u = torch.stack([torch.rand((2, T), generator=g) for g in gen], dim=1)  # (2,B,T)
    r = torch.stack([torch.randint(n_ids, (T,), generator=g) for g in gen])  # (B,T)
    return u[0], u[1], r


def mask_tokens(input_ids: Tensor, special: SpecialTokens, vocab_size: int,
                config: MaskingConfig = MaskingConfig(), *, word_starts: Tensor | None = None,
                generator: torch.Generator | Sequence[torch.Generator] | None = None
                ) -> tuple[Tensor, Tensor]:
    """Mask a batch of blocks.

    Args:
        input_ids: ``(B,T)`` int64 token ids (left unchanged).
        special: the tokenizer's special ids (``special.mask`` is the mask token).
        vocab_size: vocabulary size; random replacements are drawn from its non-special ids.
        config: the rates and whole-word switch.
        word_starts: ``(B,T)`` bool, True where a token begins a word; required for whole-word.
        generator: a CPU ``torch.Generator`` for the batch, a sequence of B (one per row), or None
            (the global generator).

    Returns:
        ``(masked_ids, labels)``, both ``(B,T)`` int64 on the device of ``input_ids``; labels are the
        original ids at selected positions and -100 elsewhere.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B,T), got shape {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    device = input_ids.device
    ids = input_ids.long()
    repl = _replacement_ids(int(vocab_size), tuple(special.ids))
    u_sel, u_act, r = (t.to(device) for t in _draw(generator, B, T, len(repl)))
    is_special = torch.isin(ids, torch.tensor(special.ids, device=device))  # (B,T)
    if config.whole_word:
        if word_starts is None or tuple(word_starts.shape) != (B, T):
            raise ValueError("whole-word masking needs word_starts of shape (B,T)")
        starts = word_starts.to(device).bool() | is_special  # (B,T) a special token is its own word
        starts[:, 1:] |= is_special[:, :-1]  # … and so the token after it starts one
        starts[:, 0] = True
        pos = torch.arange(T, device=device).expand(B, T)  # (B,T)
        word_start = torch.where(starts, pos, 0).cummax(dim=1).values  # (B,T) start of each token's word
        u_sel = u_sel.gather(1, word_start)  # (B,T) one draw per word
    selected = (u_sel < config.select_rate) & ~is_special  # (B,T)
    labels = torch.where(selected, ids, IGNORE_INDEX)
    to_mask = selected & (u_act < config.mask_rate)
    to_random = selected & (u_act >= config.mask_rate) & (u_act < config.mask_rate + config.random_rate)
    out = torch.where(to_mask, special.mask, ids)
    # index_select, not repl[r]: advanced indexing is ~1000x slower on this CPU build of torch
    random_ids = repl.to(device).index_select(0, r.reshape(-1)).view(B, T)  # (B,T)
    out = torch.where(to_random, random_ids, out)
    return out, labels


def _mix(seed: int, position: int) -> int:
    """splitmix64 of (seed, position) → a 63-bit generator seed."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(position) + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) >> 1


def position_generators(seed: int, positions: Sequence[int] | np.ndarray | Tensor) -> list[torch.Generator]:
    """One CPU generator per global sample position (see :meth:`BlockSampler.positions`), seeded
    from ``(seed, position)``: masks independent of batching and of the number of processes."""
    return [torch.Generator().manual_seed(_mix(seed, int(p))) for p in positions]
