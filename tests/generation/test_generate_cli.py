"""``qkv generate`` on a tiny saved causal LM with a WordPiece tokenizer."""

from __future__ import annotations

import pytest
import torch

from qkv.cli import main


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    from pydoc_data.topics import topics

    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_causal_lm
    from qkv.checkpoints.io import save

    texts = [topics[k] for k in sorted(topics)][:40]
    tok = train_tokenizer(texts, vocab_size=200, max_chars=60_000)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=24, norm="pre", dropout=0.0)
    folder = tmp_path_factory.mktemp("lm") / "lm"
    save(build_causal_lm(cfg), folder, tokenizer=tok.backend)
    return folder


def _tokenizer(folder):
    import qkv

    return qkv.load(folder).tokenizer


def test_one_prompt_streams_the_greedy_continuation(lm_folder, capsys):
    from qkv.generation.prompts import generate_texts

    import qkv

    assert main(["generate", str(lm_folder), "the class", "--greedy", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    model, tok = qkv.load(lm_folder)
    expected = generate_texts(model, tok, ["the class"], max_new_tokens=6)[0]
    assert out == "the class" + expected + "\n"
    assert "##" not in out and "[SEP]" not in out and "[CLS]" not in out
    assert main(["generate", str(lm_folder), "the class", "--greedy", "--max-new-tokens", "6", "--no-stream"]) == 0
    assert capsys.readouterr().out == out


def test_several_prompts_are_batched_and_seeded(lm_folder, capsys):
    argv = ["generate", str(lm_folder), "the class", "a function is", "--max-new-tokens", "5", "--seed", "3",
            "--top-k", "20", "--top-p", "0.9", "--temperature", "0.8"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    blocks = first.strip("\n").split("\n\n")
    assert len(blocks) == 2 and blocks[0].startswith("the class") and blocks[1].startswith("a function is")


def test_sliding_lets_the_text_outgrow_the_window(lm_folder, capsys):
    argv = ["generate", str(lm_folder), "the class", "--greedy", "--max-new-tokens", "30"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--sliding" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--sliding"]) == 0


def test_prompt_helpers_follow_the_tokenizer(lm_folder):
    from qkv.generation.prompts import prompt_ids, special_ids

    tok = _tokenizer(lm_folder)
    bos, eos, pad = special_ids(tok)
    ids = prompt_ids(tok, "the class")
    assert ids[0] == bos == tok.token_to_id("[CLS]") and eos not in ids and eos == tok.token_to_id("[SEP]")
    with pytest.raises(ValueError, match="empty prompt"):
        prompt_ids(tok, "  ")


def test_pad_prompts_takes_strings_with_a_tokenizer(lm_folder):
    from qkv.generation.prompts import pad_prompts
    from qkv.generation.prompts import prompt_ids

    tok = _tokenizer(lm_folder)
    ids, mask = pad_prompts(["the class", "a function is defined"], tokenizer=tok)
    long = prompt_ids(tok, "a function is defined")
    short = prompt_ids(tok, "the class")
    assert ids[1].tolist() == long and ids[0, -len(short):].tolist() == short
    assert mask[0].tolist() == [0] * (len(long) - len(short)) + [1] * len(short)
    with pytest.raises(ValueError, match="tokenizer="):
        pad_prompts(["the class"])


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_precision_decodes_the_prepared_model(lm_folder, capsys, precision):
    """--precision runs the model for_inference prepares: the same text as the API on that model."""
    from qkv.generation.prompts import generate_texts
    from qkv.hardware import precision_unsupported
    from qkv.inference import for_inference

    import qkv

    argv = ["generate", str(lm_folder), "the class", "--greedy", "--max-new-tokens", "6", "--precision", precision]
    why = precision_unsupported(precision, torch.device("cpu"))
    if why is not None:
        assert main(argv) == 2 and precision in capsys.readouterr().err
        return
    assert main(argv) == 0
    out = capsys.readouterr().out
    model, tok = qkv.load(lm_folder)
    expected = generate_texts(for_inference(model, precision, smoothing=None), tok, ["the class"], max_new_tokens=6)[0]
    assert out == "the class" + expected + "\n"
