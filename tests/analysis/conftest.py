"""Fixtures for the analysis tests: a tiny Hugging Face BERT folder with random weights and its own
small WordPiece tokenizer trained on the standard library's pydoc text (no network, no checkpoint)."""

from __future__ import annotations

import pytest
from analysis_support import D_MODEL, MAX_LEN, N_HEADS, N_LAYERS, pydoc_texts


def _train_tokenizer(texts):
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from tokenizers.trainers import WordPieceTrainer

    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(texts, WordPieceTrainer(vocab_size=400, special_tokens=specials))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """A folder with a random-weight ``BertModel`` (``save_pretrained``) and ``tokenizer.json``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny_bert")
    tok = _train_tokenizer(pydoc_texts(80))
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=D_MODEL, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, intermediate_size=40, max_position_embeddings=MAX_LEN,
        initializer_range=0.3,  # larger than BERT's 0.02, so that attention is far from uniform
    )
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_hf_model(tiny_hf_folder):
    """The tiny folder loaded by ``transformers`` itself (eager attention, so weights are returned)."""
    transformers = pytest.importorskip("transformers")
    return transformers.BertModel.from_pretrained(tiny_hf_folder, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_hf_folder):
    from qkv.analysis.inputs import tokenizer_view
    from qkv.data.tokenizer_facade import read_tokenizer

    return tokenizer_view(read_tokenizer(tiny_hf_folder))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models here are faster on one thread (no pool wake-ups on a busy 2-core machine)."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
