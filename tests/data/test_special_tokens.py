"""Special tokens by role, read from each family's tokenizer configuration (qkv.data.special_tokens), and
the tokenizer call that pads (qkv.data.model_tokenizer) — checked against transformers' own tokenizers."""

import json
import pickle

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE, Unigram

import qkv
from qkv.data.errors import TokenizerError
from qkv.data.model_tokenizer import ModelTokenizer, read_model_tokenizer
from qkv.data.special_tokens import read_declared, resolve_specials
from qkv.data.tokenizer_facade import TokenizerView, read_tokenizer, write_tokenizer

transformers = pytest.importorskip("transformers")

BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "a"]
TEXTS = ["the cat sat on the mat", "a cat", "the mats sat on a cat on the mat"]


def _roles(sp):
    return {r: sp.token(r) for r in ("cls", "sep", "pad", "mask", "unk", "bos", "eos")}


def test_roberta_byte_level_bpe(bpe_tok):
    sp = resolve_specials(bpe_tok)
    assert _roles(sp) == {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>",
                          "bos": "<s>", "eos": "</s>"}
    assert (sp.prefix, sp.suffix, sp.pair_middle, sp.pair_suffix, sp.pair_type) == ((0,), (2,), (2, 2), (2,), 0)


def test_bert_wordpiece_from_vocab(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    sp = resolve_specials(read_tokenizer(tmp_path))
    assert _roles(sp) == {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]", "unk": "[UNK]",
                          "bos": "[CLS]", "eos": "[SEP]"}
    assert (sp.prefix, sp.suffix, sp.pair_middle, sp.pair_suffix, sp.pair_type) == ((2,), (3,), (3,), (3,), 1)


def test_gpt2_has_no_template():
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3}
    tok = Tokenizer(BPE(vocab, [], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    sp = resolve_specials(tok)
    assert (sp.prefix, sp.suffix) == ((), ())
    assert _roles(sp) == {"cls": None, "sep": None, "pad": None, "mask": None, "unk": None, "bos": None,
                          "eos": "<|endoftext|>"}
    view = TokenizerView(tok)
    assert view.pad_id == 0 and view.frame([1, 2]) == [1, 2]  # padding by eos, no template


def test_modernbert_style_bpe_with_bert_names():
    """ModernBERT's tokenizer: BPE, [CLS] $A [SEP] by a TemplateProcessing, [PAD]/[MASK]/[UNK] added."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "[MASK]": 4, "a": 5, "b": 6}
    tok = Tokenizer(BPE(vocab, [], unk_token="[UNK]"))
    tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    sp = resolve_specials(tok)
    assert (sp.prefix, sp.suffix, sp.pair_middle, sp.pair_type) == ((1,), (2,), (2,), 0)
    assert (sp.id("pad"), sp.id("mask"), sp.id("unk")) == (3, 4, 0)


@pytest.mark.parametrize("style", ["xlmr", "t5"])
def test_sentencepiece_unigram(style):
    """SentencePiece (Unigram) tokenizers: XLM-R's <s> $A </s>, and T5's $A </s> (no cls, no mask)."""
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁a", -1.0), ("▁b", -1.0), ("<mask>", 0.0)]
    tok = Tokenizer(Unigram(pieces, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    if style == "xlmr":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                           special_tokens=[("<s>", 0), ("</s>", 2)])
        want = ((0,), (2,), (2, 2))
    else:
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                           special_tokens=[("</s>", 2)])
        want = ((), (2,), (2,))
    sp = resolve_specials(tok)
    assert (sp.prefix, sp.suffix, sp.pair_middle) == want
    assert (sp.id("pad"), sp.id("unk"), sp.id("eos")) == (1, 3, 2)
    assert sp.token("cls") == ("<s>" if style == "xlmr" else None)


def test_declared_tokens_win(tmp_path, bpe_tok):
    """What tokenizer_config.json / special_tokens_map.json declare wins over the names qkv knows."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": {"content": "<unk>"},
                                                                "mask_token": "<s>", "cls_token": "not-there"}))
    (tmp_path / "special_tokens_map.json").write_text("[1, 2]")  # not an object: declares nothing
    declared = read_declared(tmp_path)
    assert declared == {"pad": "<unk>", "mask": "<s>", "cls": "not-there"}
    sp = resolve_specials(bpe_tok, declared)
    assert (sp.token("pad"), sp.token("mask"), sp.token("cls")) == ("<unk>", "<s>", "<s>")  # unknown: ignored
    assert sp.declared == {"pad": "<unk>", "mask": "<s>"}


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_tokenizer_call_equals_transformers(tmp_path, bpe_tok, family):
    """``tokenizer(texts)`` pads and masks as transformers' tokenizer does (pairs too)."""
    if family == "roberta":
        from bpe_support import save_tokenizer

        save_tokenizer(bpe_tok, tmp_path)
    else:
        (tmp_path / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    theirs = (transformers.AutoTokenizer.from_pretrained(tmp_path) if family == "roberta" else
              transformers.BertTokenizerFast(str(tmp_path / "vocab.txt")))
    ours = read_model_tokenizer(tmp_path)
    assert isinstance(ours, ModelTokenizer) and ours.get_vocab_size() == theirs.backend_tokenizer.get_vocab_size()
    got, want = ours(TEXTS), theirs(TEXTS, padding=True, return_tensors="pt")
    assert set(got) == {"input_ids", "attention_mask"}
    for key in got:
        assert torch.equal(got[key], want[key]), key
    got = ours(TEXTS, TEXTS[::-1], return_tensors="np")
    want = theirs(TEXTS, TEXTS[::-1], padding=True, return_tensors="np")
    for key in ("input_ids", "attention_mask") + (("token_type_ids",) if family == "bert" else ()):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    cut = ours(TEXTS, max_len=6, truncation=True)
    assert cut["input_ids"].shape == (3, 6)
    assert torch.equal(cut["input_ids"], theirs(TEXTS, max_length=6, truncation=True, padding=True,
                                                return_tensors="pt")["input_ids"])
    with pytest.raises(TokenizerError, match=r"^text 0 has \d+ tokens with its special tokens, more than max_len=6; "
                                             r"shorten it, raise max_len, or pass truncation=True$"):
        ours(TEXTS, max_len=6)


def test_model_tokenizer_is_the_tokenizers_api_and_pickles(roberta_bpe):
    folder, _ = roberta_bpe
    model, tok = qkv.load(folder)
    assert tok.encode("the cat").ids == Tokenizer.from_file(str(folder / "tokenizer.json")).encode("the cat").ids
    again = pickle.loads(pickle.dumps(tok))
    assert again.specials == tok.specials and again.to_str() == tok.to_str()
    with torch.no_grad():
        out = model(**tok(["the cat sat", "a"]))  # the batch goes straight into the model
    assert out.last_hidden_state.shape[:2] == (2, tok(["the cat sat"])["input_ids"].shape[1])
    assert "cls=<s> sep=</s> pad=<pad> mask=<mask>" in repr(tok)


def test_hf_tokenizer_config_names_the_class(tmp_path, bpe_tok):
    for name, tok in (("rob", bpe_tok),):
        (tmp_path / name).mkdir()
        write_tokenizer(tok, tmp_path / name, max_len=38)
        cfg = json.loads((tmp_path / name / "tokenizer_config.json").read_text())
        assert cfg["tokenizer_class"] == "RobertaTokenizer" and cfg["mask_token"] == "<mask>"
        theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        assert theirs.mask_token_id == 4 and theirs.pad_token_id == 1
        assert theirs("a cat")["input_ids"] == bpe_tok.encode("a cat").ids
