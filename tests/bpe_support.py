"""RoBERTa-style checkpoints with a byte-level BPE tokenizer, as transformers saves them (offline, random
weights): the tokenizer is trained here on pydoc text and written by ``RobertaTokenizerFast.save_pretrained``
(``<s> <pad> </s> <unk> <mask>``, ``RobertaProcessing``), the model by ``save_pretrained``."""

from pathlib import Path

import torch

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
SIZES = dict(hidden_size=24, num_attention_heads=3, intermediate_size=40, num_hidden_layers=2,
             max_position_embeddings=130, type_vocab_size=1, pad_token_id=1)
LABELS = ("neg", "pos")
TAGS = ("O", "B-X", "I-X")


def bpe_tokenizer(texts, vocab_size=300):
    """A RoBERTa byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts``."""
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS)
    tok = bpe._tokenizer
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def save_tokenizer(tok, folder: Path):
    """Write ``tok`` as transformers' ``RobertaTokenizerFast`` does (tokenizer.json, tokenizer_config.json)."""
    from transformers import RobertaTokenizerFast

    fast = RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    fast.save_pretrained(folder)
    return fast


def roberta_folder(folder: Path, tok, kind="encoder", seed=0, **overrides):
    """A random-weight transformers RoBERTa of ``kind`` (encoder, masked_lm, sequence, token) with
    ``tok`` saved beside it; returns the transformers model (eval mode)."""
    import transformers

    classes = {"encoder": "RobertaModel", "masked_lm": "RobertaForMaskedLM",
               "sequence": "RobertaForSequenceClassification", "token": "RobertaForTokenClassification"}
    labels = {"sequence": LABELS, "token": TAGS}.get(kind, ())
    extra = dict(id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)}) if labels else {}
    torch.manual_seed(seed)
    cfg = transformers.RobertaConfig(vocab_size=tok.get_vocab_size(), **{**SIZES, **extra, **overrides})
    model = getattr(transformers, classes[kind])(cfg).eval()
    model.save_pretrained(folder)
    save_tokenizer(tok, folder)
    return model
