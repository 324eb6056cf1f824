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
"""

from qkv.data.cache import TokenCache, build_token_cache, default_cache_dir, open_token_cache
from qkv.data.corpus import Corpus, CorpusOptions, Document, TrainEval, open_corpus, train_eval_corpora
from qkv.data.datasets import DATASETS
from qkv.data.errors import (
    CacheError,
    CorpusDecodeError,
    CorpusError,
    CorpusFormatError,
    CorpusNotFoundError,
    DatasetNotInstalledError,
    DocumentTooLongError,
    EmptyCorpusError,
    TokenizerError,
    UnknownDatasetError,
)
from qkv.data.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, position_generators
from qkv.data.packing import Blocks, BlockSampler, PackedBlocks
from qkv.data.pipeline import MLMBatch, MLMBatches, PretrainingData, prepare_pretraining_data
from qkv.data.tokenizer import (
    SPECIAL_TOKENS,
    SpecialTokens,
    WordPieceTokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "Corpus", "CorpusOptions", "Document", "TrainEval", "open_corpus", "train_eval_corpora", "DATASETS",
    "WordPieceTokenizer", "SpecialTokens", "SPECIAL_TOKENS", "train_tokenizer", "load_tokenizer",
    "TokenCache", "build_token_cache", "open_token_cache", "default_cache_dir",
    "PackedBlocks", "Blocks", "BlockSampler",
    "MaskingConfig", "mask_tokens", "position_generators", "IGNORE_INDEX",
    "MLMBatch", "MLMBatches", "PretrainingData", "prepare_pretraining_data",
    "CorpusError", "CorpusNotFoundError", "EmptyCorpusError", "CorpusDecodeError", "DocumentTooLongError",
    "CorpusFormatError", "UnknownDatasetError", "DatasetNotInstalledError", "TokenizerError", "CacheError",
]
