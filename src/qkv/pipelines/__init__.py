"""Pipelines in memory, in the shape of ``transformers``' pipelines: :func:`qkv.pipeline` (defined in
:mod:`qkv.pipelines.factory`) for fill-mask, text classification, token classification, feature
extraction and text generation — lists of dicts with the keys ``transformers`` uses, batched and
padding-free."""
