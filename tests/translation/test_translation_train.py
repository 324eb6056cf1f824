"""Training a translation model on the engine: a tiny parallel set is learned in a test-sized run,
the run folder ends with a model folder that ``translate`` and ``qkv translate`` read, and bad input
is refused in one line."""

from __future__ import annotations

import random

import pytest

import qkv
from qkv.cli import main
from qkv.data.pairs import Pair
from qkv.translation.errors import TranslationError
from qkv.translation.evaluate import evaluate_translation
from qkv.translation.train import train_translation
from qkv.translation.translate import translate

EN = "zero one two three four five six seven eight nine".split()
ES = "cero uno dos tres cuatro cinco seis siete ocho nueve".split()
FIXED = [("one two", "uno dos"), ("three", "tres"), ("four five six", "cuatro cinco seis"), ("nine", "nueve")]


def _numbers(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        idx = [rng.randrange(10) for _ in range(rng.randint(1, 4))]
        out.append((" ".join(EN[i] for i in idx), " ".join(ES[i] for i in idx)))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tr") / "run"
    pairs = FIXED * 8
    r = train_translation("en-es", preset="tiny", steps=150, out=out, train_pairs=pairs, held_out=FIXED,
                          progress=False, vocab_size=64)
    return r


def test_a_tiny_parallel_set_is_memorised(run):
    assert run.result.status == "complete" and run.pairs == 32 and run.left_out == 0
    assert translate(run.model, run.tokenizer, [s for s, _ in FIXED]) == [t for _, t in FIXED]
    assert translate(run.model, run.tokenizer, [s for s, _ in FIXED], beams=3, batch_size=2) == [t for _, t in FIXED]
    assert run.result.final_eval["chrf"] == 100.0


def test_the_run_folder_holds_a_model_that_translate_reads(run, tmp_path, capsys):
    model, tok = qkv.load(run.out / "model")
    assert translate(model, tok, ["three", "nine"]) == ["tres", "nueve"]
    assert main(["translate", str(run.out / "model"), "three", "one two", "--beams", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["tres", "uno dos"]
    src = tmp_path / "in.txt"
    src.write_text("nine\nfour five six\n", encoding="utf-8")
    assert main(["translate", str(run.out / "model"), "--input", str(src), "--output", str(tmp_path / "o.txt")]) == 0
    assert (tmp_path / "o.txt").read_text(encoding="utf-8") == "nueve\ncuatro cinco seis\n"


def test_evaluate_reports_the_model_beside_the_baselines(run):
    held = [Pair(s, t, f"t#{i}") for i, (s, t) in enumerate(FIXED)]
    report = evaluate_translation(run.model, run.tokenizer, "en-es", pairs=held, beams=(1, 2), baselines=False)
    assert [r.name for r in report.rows] == ["model, greedy", "model, beam 2"]
    assert report.rows[0].chrf == 100.0  # BLEU is 0 on sentences this short: they hold no 4-gram
    assert report.samples["best"][0]["model"] == report.samples["best"][0]["reference"]
    assert "| model, beam 2 | " in report.table()


@pytest.mark.parametrize("texts, kwargs, match", [
    ([""], {}, "text 0 is empty"),
    (["one " * 60], {}, "more than the model's window max_len=48"),
    (["one"], dict(beams=0), "beams must be an int ≥ 1"),
    (["one"], dict(batch_size=0), "batch_size must be an int ≥ 1"),
    ("one", {}, "texts must be a list of strings"),
    (["one"], dict(too_long="cut"), "too_long='cut'; allowed: error, copy"),
])
def test_bad_input_is_refused_in_one_line(run, texts, kwargs, match):
    with pytest.raises(TranslationError, match=match) as e:
        translate(run.model, run.tokenizer, texts, **kwargs)
    assert "\n" not in str(e.value)


def test_too_long_sources_may_be_copied(run):
    long = "one " * 60
    assert translate(run.model, run.tokenizer, [long, "three"], too_long="copy") == [long, "tres"]


def test_training_refusals():
    with pytest.raises(TranslationError, match="no training pairs"):
        train_translation(train_pairs=[], held_out=FIXED, preset="tiny", steps=1, progress=False)
    with pytest.raises(TranslationError, match="direction 'english' must be SOURCE-TARGET"):
        train_translation("english", train_pairs=FIXED, preset="tiny", steps=1, progress=False)
    with pytest.raises(ValueError, match="unknown recipe option"):
        train_translation(train_pairs=FIXED, held_out=FIXED, preset="tiny", steps=1, progress=False, dropout=0.3)
    with pytest.raises(ValueError, match="preset"):
        train_translation(train_pairs=FIXED, held_out=FIXED, preset="huge", steps=1, progress=False)
    with pytest.raises(ValueError, match="threads='adaptive' needs a time_budget"):
        train_translation(train_pairs=FIXED, held_out=FIXED, preset="tiny", steps=1, progress=False, threads="adaptive")
    with pytest.raises(ValueError, match="threads=0 must be a number"):
        train_translation(train_pairs=FIXED, held_out=FIXED, preset="tiny", steps=1, progress=False, threads=0)


@pytest.mark.slow
def test_a_small_model_learns_to_translate_unseen_number_sentences():
    pairs = _numbers(300, 0)
    r = train_translation(train_pairs=pairs[:260], held_out=pairs[260:], preset="tiny", steps=600, progress=False,
                          vocab_size=80)
    assert r.result.final_eval["bleu"] > 80


def test_inspect_draws_cross_attention_for_a_subword_translation_model(run, tmp_path):
    from qkv.analysis.viewer import run_inspect

    ins, paths = run_inspect(run.out / "model", "four five six", tmp_path / "ins")
    assert ins.source_tokens[-1] == "[EOS]" and "▁six" in ins.source_tokens
    L, H, T, S = ins.cross_attentions.shape
    assert (L, H, S) == (1, 4, len(ins.source_tokens)) and paths["cross_0"].is_file()
    assert "".join((tmp_path / "ins" / "generated.txt").read_text().split()).startswith("▁cu")


def test_shared_names_are_capitalised_words_of_both_sides_not_the_first():
    from qkv.translation.alignment import shared_names

    assert shared_names("And Abraham went to Jerusalem with Isaac.", "Y fué Abraham á Jerusalem con Isaac.") == [
        "Abraham", "Isaac", "Jerusalem"]
    assert shared_names("Daniel said", "Daniel dijo") == []  # first words are capitalised anyway
    assert shared_names("and Moses spake", "y Moisés habló") == []


def test_name_alignment_scores_every_name_occurrence(run):
    from qkv.translation.alignment import name_alignment

    pairs = [("one Abraham two", "uno Abraham dos"), ("three Abraham Abraham", "tres Abraham Abraham"),
             ("nine", "nueve")]
    report = name_alignment(run.model, run.tokenizer, pairs)
    assert (report.points, report.pairs) == (3, 2)
    assert report.per_head.shape == (1, 4) and report.per_layer.shape == (1,)
    assert 0 <= report.averaged <= 1 and 0 < report.chance < 1
    assert "| 1 |" in report.table()
    with pytest.raises(TranslationError, match="no pair holds a name"):
        name_alignment(run.model, run.tokenizer, [("nine", "nueve")])


@pytest.mark.slow
def test_pretrain_objective_translation_trains_on_the_bible_pairs(tmp_path, capsys):
    from qkv.data.bible import bible_pairs
    from qkv.data.errors import DatasetNotInstalledError

    try:
        bible_pairs("en", "es", "validation")
    except DatasetNotInstalledError:
        pytest.skip("Debian sword-text-kjv / sword-text-sparv not installed; run `make data`")
    out = tmp_path / "run"
    argv = ["pretrain", "--objective", "translation", "--corpus", "dataset:bible-en-es", "--preset", "tiny",
            "--steps", "2", "--vocab-size", "500", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "validation verses, greedy): BLEU" in capsys.readouterr().out
    assert (out / "model" / "qkv.json").is_file()
    assert main(["pretrain", "--out", str(out), "--resume", "--no-progress"]) == 0  # a finished run: unchanged
