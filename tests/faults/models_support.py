"""Model folders of every family qkv reads, as their writers leave them (random weights, tiny distinct sizes),
for the model-folder walker (``test_faults_models.py``).

Hugging Face folders are written by transformers' ``save_pretrained`` (model and fast tokenizer): BERT and
DistilBERT masked LMs with a WordPiece tokenizer, a RoBERTa masked LM with its byte-level BPE tokenizer
(``<s> </s> <pad>``, :mod:`bpe_support`), a GPT-2 causal LM with a byte-level BPE tokenizer, a ViT image
classifier (8×8 grey pictures, no tokenizer), a Marian translation model with a fast tokenizer (its own
``MarianTokenizer`` needs sentencepiece, which a folder without ``tokenizer.json`` stands for — qkv reads
only ``tokenizer.json``/``vocab.txt``). The qkv-native folders: the suite's masked LM and image classifier.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bpe_support import roberta_folder

#: the documents of ``docs.txt``
DOCS = ("The cat sat on the mat.", "Return the value of the expression, then stop.",
        "A module holds functions, classes and variables.")
FAMILIES = ("bert", "distilbert", "roberta", "gpt2", "vit", "marian", "qkv", "qkv-vit")
#: the families whose inputs are pictures
IMAGE_FAMILIES = ("vit", "qkv-vit")
#: the mask token of each family's tokenizer (``None``: it has none)
MASK = {"bert": "[MASK]", "distilbert": "[MASK]", "roberta": "<mask>", "qkv": "[MASK]"}


def _copy(tok):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tok.to_str())


def _wordpiece_folder(folder: Path, family: str, wp) -> None:
    import transformers

    torch.manual_seed(1)
    if family == "bert":  # C 24, H 3, F 40, 2 layers, P 40
        cfg = transformers.BertConfig(vocab_size=wp.get_vocab_size(), hidden_size=24, num_attention_heads=3,
                                      intermediate_size=40, num_hidden_layers=2, max_position_embeddings=40)
        transformers.BertForMaskedLM(cfg).eval().save_pretrained(folder)
        transformers.BertTokenizerFast(tokenizer_object=_copy(wp)).save_pretrained(folder)
    else:  # C 20, H 2, F 36, 3 layers, P 36
        cfg = transformers.DistilBertConfig(vocab_size=wp.get_vocab_size(), dim=20, n_heads=2, hidden_dim=36,
                                            n_layers=3, max_position_embeddings=36)
        transformers.DistilBertForMaskedLM(cfg).eval().save_pretrained(folder)
        transformers.DistilBertTokenizerFast(tokenizer_object=_copy(wp)).save_pretrained(folder)


def _gpt2_folder(folder: Path, bpe) -> None:
    import transformers
    from tokenizers import processors

    torch.manual_seed(2)
    tok = _copy(bpe)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    eos = tok.token_to_id("</s>")
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=16, n_head=2, n_layer=2, n_positions=30,
                                  n_inner=28, bos_token_id=eos, eos_token_id=eos)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    transformers.GPT2TokenizerFast(tokenizer_object=tok, bos_token="</s>", eos_token="</s>",
                                   unk_token="<unk>").save_pretrained(folder)


def _vit_folder(folder: Path) -> None:
    import transformers

    torch.manual_seed(3)
    cfg = transformers.ViTConfig(hidden_size=12, num_hidden_layers=2, num_attention_heads=2, intermediate_size=28,
                                 image_size=8, patch_size=2, num_channels=1, id2label={0: "a", 1: "b", 2: "c"},
                                 label2id={"a": 0, "b": 1, "c": 2})
    transformers.ViTForImageClassification(cfg).eval().save_pretrained(folder)


def _marian_folder(folder: Path, bpe) -> None:
    import transformers
    from tokenizers import processors

    torch.manual_seed(4)
    tok = _copy(bpe)
    eos, pad = tok.token_to_id("</s>"), tok.token_to_id("<pad>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    cfg = transformers.MarianConfig(vocab_size=tok.get_vocab_size(), d_model=16, encoder_layers=2, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                    decoder_ffn_dim=24, max_position_embeddings=32, pad_token_id=pad,
                                    eos_token_id=eos, decoder_start_token_id=pad, forced_eos_token_id=None)
    transformers.MarianMTModel(cfg).eval().save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>").save_pretrained(folder)


def build_families(root: Path, wp, bpe, qkv_folder: Path) -> dict[str, Path]:
    """``family: folder`` for :data:`FAMILIES` under ``root`` (``wp``: a WordPiece ``tokenizers.Tokenizer``,
    ``bpe``: a RoBERTa byte-level BPE one; ``qkv_folder``: a qkv masked-LM folder, used as it is)."""
    folders = {f: root / f for f in FAMILIES}
    folders["qkv"] = qkv_folder
    for family in ("bert", "distilbert"):
        _wordpiece_folder(folders[family], family, wp)
    torch.manual_seed(5)
    roberta_folder(folders["roberta"], bpe, "masked_lm")
    _gpt2_folder(folders["gpt2"], bpe)
    _vit_folder(folders["vit"])
    _marian_folder(folders["marian"], bpe)
    _qkv_vit(folders["qkv-vit"])
    return folders


def _qkv_vit(folder: Path) -> None:
    from qkv.checkpoints.io import save
    from qkv.models.heads import TaskConfig
    from qkv.models.vision_builders import build_image_classifier
    from qkv.vision.config import model_config

    torch.manual_seed(6)
    save(build_image_classifier(model_config("vit-digits", {"image": {"patch": 2}}, n_layers=1),
                                TaskConfig("sequence-classification", ("a", "b"))), folder)


def build_inputs(root: Path) -> dict[str, Path]:
    """The files the commands read: plain documents, labelled records (with splits), an 8×8 grey picture."""
    root.mkdir(parents=True, exist_ok=True)
    docs = root / "docs.txt"
    docs.write_text("".join(d + "\n" for d in DOCS))
    words = ["cat", "dog", "value", "module", "class", "mat"]
    rows = [{"text": f"the {words[i % 6]} and the {words[(i * 5) % 6]}.", "label": "ab"[i % 2],
             "split": "train" if i < 10 else "test"} for i in range(16)]
    labelled = root / "labelled.jsonl"
    labelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    picture = root / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8)).save(picture)
    return {"docs": docs, "labelled": labelled, "picture": picture}
