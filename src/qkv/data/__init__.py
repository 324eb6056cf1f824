"""Data pipeline for masked-language-model pretraining: corpus → tokenizer → token cache → packed
blocks → dynamic masks. See ``docs/data.md``; the one-call entry point is
:func:`prepare_pretraining_data`.

Modules: :mod:`~qkv.data.corpus` (specs, streaming, held-out split), :mod:`~qkv.data.readers`
(the one reader of text, JSONL, CSV/TSV and ``.gz`` files, for every command),
:mod:`~qkv.data.datasets` (named offline datasets), :mod:`~qkv.data.tokenizer` (WordPiece training),
:mod:`~qkv.data.tokenizer_facade` (every tokenizer qkv reads: loading, the view without truncation or
padding, the special-token check, saving), :mod:`~qkv.data.windows` (long texts → model windows →
batches, for embeddings, fine-tuning and analysis), :mod:`~qkv.data.cache` (memory-mapped token
cache), :mod:`~qkv.data.packing` (blocks and sampling), :mod:`~qkv.data.masking` (MLM masks),
:mod:`~qkv.data.pipeline` (all together), :mod:`~qkv.data.errors` (the error types).
Parallel text for translation: :mod:`~qkv.data.sword` (SWORD Bible modules; markup in
:mod:`~qkv.data.sword_markup`, verse slots in :mod:`~qkv.data.versification`),
:mod:`~qkv.data.verse_align` (a length-based check that two Bibles' verses match),
:mod:`~qkv.data.bible` (``dataset:bible-en-es``, split by whole books), :mod:`~qkv.data.pairs`
(pair files through the record reader).

Import each name from the module that defines it."""
