"""A random-weight RoBERTa with a byte-level BPE tokenizer (<s> </s> <pad> <mask>), as transformers saves it,
through every command: qkv embed, qkv finetune (and its classifier back to transformers), qkv inspect,
qkv convert --to sentence-transformers — each matching transformers or sentence-transformers."""

import json
import random

import numpy as np
import pytest
import torch

import qkv
from qkv.cli import main

transformers = pytest.importorskip("transformers")

TEXTS = ["The cat sat on the mat.", "Return the value of the expression.",
         "A longer sentence about the module and its functions, written for the test."]


def _hf_mean_vectors(folder, texts):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.RobertaModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state  # (B,T,C)
    mask = batch["attention_mask"][..., None].float()
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1).numpy()


def test_qkv_embed_matches_transformers(roberta_bpe, tmp_path, capsys):
    folder, _ = roberta_bpe
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "v.npy"
    assert main(["embed", str(folder), str(docs), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    np.testing.assert_allclose(np.load(out), _hf_mean_vectors(folder, TEXTS), atol=1e-5)
    np.testing.assert_allclose(qkv.embed(folder, TEXTS, pooling="cls", normalize=False)[:, :3],
                               _cls(folder, TEXTS)[:, :3], atol=1e-5)  # cls pooling reads <s>


def _cls(folder, texts):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.RobertaModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**tok(texts, padding=True, return_tensors="pt")).last_hidden_state[:, 0].numpy()


def test_convert_to_sentence_transformers_matches(roberta_bpe, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    folder, _ = roberta_bpe
    assert main(["convert", str(folder), str(tmp_path / "st"), "--to", "sentence-transformers"]) == 0
    theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(theirs, qkv.embed(folder, TEXTS), atol=1e-5)
    saved = json.loads((tmp_path / "st" / "tokenizer_config.json").read_text())
    assert (saved["tokenizer_class"], saved["cls_token"], saved["mask_token"]) == ("RobertaTokenizer", "<s>", "<mask>")


def test_inspect_shows_the_tokenizers_own_specials_and_transformers_attention(roberta_bpe, tmp_path):
    from qkv.analysis.viewer import inspect_text

    folder, hf = roberta_bpe
    assert main(["inspect", str(folder), "The cat sat.", "--out", str(tmp_path / "i")]) == 0
    assert (tmp_path / "i" / "viewer.html").is_file()
    ins = inspect_text(qkv.load(folder), None, "The cat sat.", "On the mat.")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok("The cat sat.", "On the mat.", return_tensors="pt")
    assert ins.input_ids.tolist() == batch["input_ids"][0].tolist()  # <s> a </s></s> b </s>
    assert ins.tokens[0] == "<s>" and ins.tokens[-1] == "</s>" and ins.special[0] and not ins.special[1]
    eager = transformers.RobertaModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        want = eager(**batch, output_attentions=True).attentions
    np.testing.assert_allclose(ins.attentions, torch.stack(want)[:, 0].numpy(), atol=1e-5)


def test_finetune_and_the_classifier_back_in_transformers(roberta_bpe, tmp_path, capsys):
    folder, _ = roberta_bpe
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(["cat", "dog", "value", "module"]) for _ in range(6)), "label": lab}
            for lab in ("a", "b") for _ in range(12)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    assert main(["finetune", str(folder), "--task", "sequence-classification", "--train",
                 str(tmp_path / "train.jsonl"), "--out", str(run), "--steps", "2", "--batch-size", "8",
                 "--no-progress", "--baselines", "none"]) == 0, capsys.readouterr().err
    model = qkv.load(run).model
    assert (model.task.pooling, model.task.head) == ("cls", "tanh")  # RoBERTa's own head
    assert main(["convert", str(run), str(tmp_path / "hf"), "--to", "hf"]) == 0
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == "RobertaForSequenceClassification"
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(batch["input_ids"], batch["attention_mask"]).logits,
                                   theirs(**batch).logits, atol=1e-5, rtol=0)
    assert main(["predict", str(run), str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "p.jsonl"),
                 "--no-progress"]) == 0


@pytest.mark.parametrize("kind", ["masked_lm", "sequence"])
def test_round_trip_through_qkv_keeps_the_byte_level_bpe_tokenizer(tmp_path, bpe_tok, kind):
    """A transformers RoBERTa converted to qkv and back: every folder on the way carries a
    tokenizer_config.json that transformers loads as a byte-level BPE tokenizer giving the original's tokens
    (never a WordPiece reading of the BPE vocabulary, which maps each word to <unk>)."""
    from bpe_support import roberta_folder

    roberta_folder(tmp_path / "hf", bpe_tok, kind)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "qkv"), "--to", "qkv"]) == 0
    assert main(["convert", str(tmp_path / "qkv"), str(tmp_path / "back"), "--to", "hf"]) == 0
    original = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    sentence = "The cat sat on the mat; return the value of the expression, don't it?"
    want = original(sentence, "A second segment.")["input_ids"]
    assert original.unk_token_id not in want
    for name in ("qkv", "back"):
        theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        assert type(theirs).__name__ in ("RobertaTokenizerFast", "RobertaTokenizer"), (name, type(theirs))
        assert theirs(sentence, "A second segment.")["input_ids"] == want, name
        assert theirs.tokenize(sentence) == original.tokenize(sentence), name
        assert (theirs.cls_token, theirs.sep_token, theirs.pad_token, theirs.mask_token, theirs.unk_token) == \
            ("<s>", "</s>", "<pad>", "<mask>", "<unk>"), name
        assert theirs.decode(want, skip_special_tokens=True) == original.decode(want, skip_special_tokens=True)
    model = transformers.AutoModel.from_pretrained(tmp_path / "back")
    assert type(model).__name__ == "RobertaModel"
