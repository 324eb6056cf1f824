"""Document embeddings: pooling, long documents, contrastive training, evaluation, search.

See ``docs/embeddings.md``. Modules: :mod:`~qkv.embeddings.embedder` (:func:`embed`,
:class:`Embedder`; long documents are windowed by :mod:`qkv.data.windows`, inputs read by
:mod:`qkv.data.readers`), :mod:`~qkv.embeddings.options` (:class:`EmbedOptions`, the embedding
options), :mod:`~qkv.embeddings.pooling`, :mod:`~qkv.embeddings.streams` (vector files out),
:mod:`~qkv.embeddings.contrastive` (SimCSE / supervised training), :mod:`~qkv.embeddings.evaluate`,
:mod:`~qkv.embeddings.search` (index folders), :mod:`~qkv.embeddings.st_folder` (sentence-transformers
folders read and written), :mod:`~qkv.embeddings.cli` (the subcommands).
"""

from qkv.embeddings.embedder import EMPTY_MODES, Embedder, EmbedStats, embed
from qkv.embeddings.errors import EmbeddingError, EmptyDocumentError, OutputFormatError
from qkv.embeddings.options import EmbedOptions
from qkv.embeddings.pooling import POOLINGS, pool

__all__ = ["embed", "Embedder", "EmbedOptions", "EmbedStats", "EMPTY_MODES", "POOLINGS", "pool",
           "EmbeddingError", "EmptyDocumentError", "OutputFormatError"]
