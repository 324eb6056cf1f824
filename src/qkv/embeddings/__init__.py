"""Document embeddings: pooling, long documents, contrastive training, evaluation, search.

See ``docs/embeddings.md``. Modules: :mod:`~qkv.embeddings.embedder` (:func:`embed`,
:class:`Embedder`; long documents are windowed by :mod:`qkv.data.windows`, inputs read by
:mod:`qkv.data.readers`), :mod:`~qkv.embeddings.options` (:class:`EmbedOptions`, the embedding
options), :mod:`~qkv.embeddings.pooling`, :mod:`~qkv.embeddings.streams` (vector files out),
:mod:`~qkv.embeddings.contrastive` (SimCSE / supervised training), :mod:`~qkv.embeddings.evaluate`,
:mod:`~qkv.embeddings.search` (index folders), :mod:`~qkv.checkpoints.st_folder` (sentence-transformers
folders read and written), :mod:`~qkv.embeddings.cli` (the subcommands).

Import each name from the module that defines it."""
