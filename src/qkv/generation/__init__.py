"""Text generation with a causal LM: greedy and sampled decoding over a KV cache.

:func:`generate` (also :meth:`qkv.models.causal_lm.CausalLM.generate`) continues a batch of
prompts; :func:`pad_prompts` left-pads prompts of different lengths; :mod:`.sampling` holds the
temperature, top-k and top-p filters. See docs/generation.md.

Import each name from the module that defines it."""
