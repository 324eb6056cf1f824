"""Text generation with a causal LM: greedy and sampled decoding over a KV cache.

:func:`generate` (also :meth:`qkv.models.causal_lm.CausalLM.generate`) continues a batch of
prompts; :func:`pad_prompts` left-pads prompts of different lengths; :mod:`.sampling` holds the
temperature, top-k and top-p filters. See docs/generation.md.
"""

from __future__ import annotations

from qkv.generation.loop import generate
from qkv.generation.prompts import generate_texts, pad_prompts
from qkv.generation.sampling import filter_logits, next_tokens

__all__ = ["generate", "pad_prompts", "generate_texts", "filter_logits", "next_tokens"]
