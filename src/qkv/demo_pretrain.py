"""``qkv demo``: pretrain the ``cpu-small`` preset on 20 Newsgroups for a fixed wall-clock budget,
then show what it learned.

1. Masked-LM pretraining on the 20 Newsgroups training split to a time budget (the learning rate
   decays to zero at the deadline whatever the machine's speed; see :mod:`qkv.training.budget`).
2. Held-out masked-token accuracy on the test split (fixed 15 % masks) against the most-frequent-
   token baseline, and when the run first passed the old demo's 10-minute figure.
3. Fill in the blank: six fixed sentences with one word masked — the true word, the model's top 5
   and the unigram baseline's.
4. Which heads specialised (attention on the previous / next token, itself, ``[CLS]``) over
   held-out blocks, a heatmap PNG and the offline attention viewer for one sentence.

The run folder is marked as the demo's (``.qkv-demo``): a later ``qkv demo`` replaces a folder
only when it carries that mark; any other non-empty folder is refused and left untouched.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from qkv.errors import QkvError
from qkv.training.config import TrainConfig
from qkv.training.metrics import read_metrics
from qkv.data.cache import open_token_cache
from qkv.data.packing import PackedBlocks
from qkv.data.tokenizer import load_tokenizer
import qkv
from qkv.analysis.fill_mask import fill_mask, unigram_distribution
from qkv.analysis.naming import head_label, layer_label
from qkv.analysis.specialisation import block_head_statistics, specialised_heads
from qkv.analysis.viewer import inspect_text, write_inspection
from qkv.config import ModelConfig
from qkv.training.loop import pretrain
from qkv.training.precision import resolve_precision
from qkv.training.metrics import plot_curve

__all__ = ["DEMO_MARK", "DemoError", "DEMO_SENTENCES", "claim_demo_dir", "run_pretrain_demo"]

DEMO_MARK = ".qkv-demo"
#: what a demo run folder holds; a marked folder with anything else in it is not replaced
DEMO_ENTRIES = frozenset({DEMO_MARK, "run.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                          "special_tokens_map.json", "metrics.jsonl", "curve.png", "checkpoints", "qkv.json",
                          "model.safetensors", "config.json", "inspect", "demo.json"})
#: the accuracy of the previous demo recipe after 10 minutes (mini, learned positions, post-LN)
OLD_DEMO_ACCURACY = 0.117

#: (sentence with one [MASK], the hidden word) — written for this demo, not taken from the corpus
DEMO_SENTENCES = [
    ("thanks in [MASK] for any help", "advance"),
    ("does anyone know where i can [MASK] a copy of this program", "get"),
    ("the space [MASK] will be launched next year", "shuttle"),
    ("please send me an [MASK] if you have any information", "email"),
    ("the hockey [MASK] won the game last night", "team"),
    ("i do not [MASK] in god", "believe"),
]
INSPECT_SENTENCE = "the space shuttle will be launched next year and nobody knows what it will cost"


class DemoError(QkvError):
    """The demo cannot run as asked (the message says why and what to do)."""


def claim_demo_dir(out: Path) -> None:
    """Make ``out`` ready for a new demo run, or refuse.

    A missing or empty folder is used; a folder marked by an earlier ``qkv demo`` that holds only
    what the demo writes is removed (the demo's own output); anything else — a file, a folder with
    other content, another qkv run, a demo folder to which something was added — is refused with
    :class:`DemoError` and not touched.
    """
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise DemoError(f"--out {out} is a file, not a folder; choose another --out")
    if not any(out.iterdir()):
        return
    if not (out / DEMO_MARK).is_file():
        raise DemoError(f"--out {out} is not empty and was not made by qkv demo; it is left untouched. "
                        "Choose another --out, or move that folder away yourself")
    extra = sorted(p.name for p in out.iterdir() if p.name not in DEMO_ENTRIES and not p.name.startswith("."))
    if extra:
        raise DemoError(f"--out {out} is an earlier demo run, but it also holds {', '.join(extra[:5])}"
                        f"{' …' if len(extra) > 5 else ''}, which the demo did not write; it is left untouched. "
                        "Move those out, or choose another --out")
    print(f"replacing the previous demo run in {out}")
    shutil.rmtree(out)


def _mark(out: Path) -> None:
    mark = out / DEMO_MARK
    if out.is_dir() and not mark.exists():
        mark.write_text(json.dumps({"made_by": "qkv demo", "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n",
                        encoding="utf-8")


def demo_config(out: str, *, minutes: float, seed: int = 0, precision: str = "auto"):
    """The demo's :class:`~qkv.training.TrainConfig`: the recipe chosen by the sweep in
    docs/pretraining.md (the ``cpu-small`` preset and the settings below)."""
    return TrainConfig(
        corpus=("dataset:20newsgroups:train",), eval_corpus=("dataset:20newsgroups:test",), out=out,
        preset="cpu-small", vocab_size=8192, max_len=128, batch_size=32, time_budget=minutes, lr=3e-3,
        position_lr_scale=30.0, warmup_steps=100, schedule="linear", select_rate=0.25, eval_every=100,
        eval_batches=8, eval_batch_size=64, save_every=250, seed=seed, precision=precision, threads="adaptive",
        log_every=10,
    )


def _first_crossing(metrics: Path, level: float) -> dict | None:
    for r in read_metrics(metrics):
        if "accuracy" in r and r["accuracy"] >= level:
            return r
    return None


def _held_out_blocks(run: Path, n_blocks: int = 64):
    meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(run)
    blocks = PackedBlocks(open_token_cache(meta["data"]["eval_cache"]), meta["train_config"]["max_len"], tok.special)
    idx = np.linspace(0, len(blocks) - 1, num=min(n_blocks, len(blocks))).round().astype(np.int64)
    b = blocks.batch(idx)
    return tok, b.input_ids, b.attention_mask, open_token_cache(meta["data"]["train_cache"])


def _print_fill_mask(examples) -> None:
    u = examples[0].unigram_top
    print("\nfill in the blank (model's top 5; the unigram baseline ranks every sentence the same: "
          + ", ".join(f"{t} {p:.1%}" for t, p in u) + ")")
    for ex in examples:
        top = ", ".join(f"{t} {p:.0%}" for t, p in ex.top)
        hit = "✓" if ex.answer_rank == 1 else f"rank {ex.answer_rank}"
        print(f"  {ex.text}")
        print(f"      true: {ex.answer:<9} model: {top}   [{hit}; unigram ranks it {ex.unigram_answer_rank}]")


def _print_heads(stats, found) -> None:
    print(f"\nheads (mean attention over 64 held-out blocks of 128 tokens; uniform ≈ {1 / 128:.3f}):")
    print("  head        previous  next   self  [CLS]  entropy")
    for layer in range(stats.n_layers):
        for h in range(stats.n_heads):
            print(f"  {head_label(layer, h):<11} {stats.prev_share[layer, h]:>7.2f} {stats.next_share[layer, h]:>6.2f} "
                  f"{stats.self_share[layer, h]:>6.2f} {stats.cls_share[layer, h]:>6.2f} {stats.entropy[layer, h]:>7.2f}")
    if found:
        print("  most specialised: " + "; ".join(h.describe() for h in found[:4]))
    else:
        print("  no head puts ≥ 0.3 of its attention on one place")


def run_pretrain_demo(out: str = "runs/demo", *, minutes: float = 8.0, seed: int = 0,
                      precision: str = "auto", sentences=DEMO_SENTENCES) -> dict:
    """Run the demo (see the module docstring); returns its figures (also written to ``demo.json``).

    ``sentences``: ``(text with one [MASK], hidden word)`` pairs for fill-in-the-blank; those whose
    word is not a single token of the trained vocabulary are listed as skipped.
    """
    if not (isinstance(minutes, (int, float)) and np.isfinite(minutes) and 0 < minutes <= 24 * 60):
        raise DemoError(f"--minutes {minutes!r} must be a number of minutes in (0, 1440], e.g. 8")
    t0 = time.perf_counter()
    out_path = Path(out)
    claim_demo_dir(out_path)
    cfg = demo_config(out, minutes=minutes, seed=seed, precision=precision)
    mc = ModelConfig.preset(cfg.preset)
    used, note = resolve_precision(precision)
    print(f"qkv demo: masked-LM pretraining of {cfg.preset} ({mc.n_layers} layers × {mc.d_model}, {mc.attention.n_heads} "
          f"heads, {mc.positions.scheme} positions, {mc.norm.placement}-LN, {cfg.select_rate:.0%} masking) on the 20 Newsgroups "
          f"training split for "
          f"{minutes:g} min of training, batch {cfg.batch_size} × {cfg.max_len} tokens, {used}"
          f"{' (' + note + ')' if note else ''}; held out: the test split")
    result = pretrain(cfg, on_backward=lambda step, model: _mark(out_path) if step == 1 else None)
    _mark(out_path)
    if result.status != "complete":
        print(f"interrupted after step {result.steps_done}; run `qkv demo --out {out}` again to start over")
        return {"status": result.status}
    plot_curve(out_path / "metrics.jsonl", out_path / "curve.png", x="minutes",
               title=f"qkv demo: {cfg.preset} on 20 Newsgroups", accuracy_marks={"old demo, 10 min": OLD_DEMO_ACCURACY})
    ev = result.final_eval
    figures = {"accuracy": ev["accuracy"], "eval_loss": ev["eval_loss"], "perplexity": ev["perplexity"],
               "most_frequent_accuracy": ev["most_frequent_accuracy"], "masked_tokens": ev["masked_tokens"],
               "steps": result.steps_done, "precision": used}
    crossed = _first_crossing(out_path / "metrics.jsonl", OLD_DEMO_ACCURACY)
    figures["minutes_to_old_demo"] = round(crossed["elapsed_s"] / 60, 2) if crossed else None
    print(f"\nheld-out (20 Newsgroups test split, {ev['masked_tokens']:,} masked tokens, fixed 15 % masks):")
    print(f"  masked-token accuracy {ev['accuracy']:.3f}  (most-frequent-token baseline "
          f"{ev['most_frequent_accuracy']:.3f}; the old 10-minute demo: {OLD_DEMO_ACCURACY})")
    print(f"  loss {ev['eval_loss']:.3f}, perplexity {ev['perplexity']:.0f}, {result.steps_done:,} steps")
    if crossed:
        print(f"  passed {OLD_DEMO_ACCURACY} after {crossed['elapsed_s'] / 60:.1f} min of training (step {crossed['step']})")

    model = qkv.load(out_path).model
    tok, ids, mask, train_cache = _held_out_blocks(out_path)
    unigram = unigram_distribution(train_cache.tokens, tok.vocab_size, tok.special.ids)
    usable = [(t, w) for t, w in sentences if len(tok.encode(w, add_special_tokens=False)) == 1]
    skipped = [w for t, w in sentences if (t, w) not in usable]
    examples = []
    if usable:
        texts, answers = zip(*usable)
        examples = fill_mask(model, tok, list(texts), answers=list(answers), unigram=unigram)
        _print_fill_mask(examples)
    if skipped:
        print(f"  (skipped, not one token of this vocabulary: {', '.join(skipped)})")
    figures["fill_mask_top1"] = sum(ex.answer_rank == 1 for ex in examples)
    figures["fill_mask"] = [{"text": ex.text, "answer": ex.answer, "top": ex.top, "rank": ex.answer_rank,
                             "unigram_rank": ex.unigram_answer_rank} for ex in examples]

    stats = block_head_statistics(model, ids, mask, cls_id=tok.special.cls, sep_id=tok.special.sep)
    found = specialised_heads(stats)
    _print_heads(stats, found)
    figures["heads"] = {k: getattr(stats, k).round(4).tolist()
                        for k in ("prev_share", "next_share", "self_share", "cls_share", "entropy")}
    figures["specialised_heads"] = [h.describe() for h in found]
    figures["heads_prev_or_next_ge_0.3"] = int(((stats.prev_share >= 0.3) | (stats.next_share >= 0.3)).sum())

    ins = inspect_text(model, tok, INSPECT_SENTENCE)  # the run's tokenizer, as the model folder's
    paths = write_inspection(ins, out_path / "inspect", title=f"qkv demo · {cfg.preset}")
    best = found[0].layer if found else 0
    figures["minutes_total"] = round((time.perf_counter() - t0) / 60, 2)
    (out_path / "demo.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print("\nlook inside:")
    print(f"  learning curve   {out_path / 'curve.png'}")
    print(f"  heatmap          {paths[f'layer_{best}']}   (every head of {layer_label(best)} on one sentence)")
    print(f"  attention viewer {paths['viewer']}   (offline; open it in a browser: "
          f"xdg-open {paths['viewer']})")
    print(f"  all layers/heads qkv analyze {out_path} --corpus dataset:20newsgroups:test --out {out_path}-analysis")
    print(f"  your own text    qkv inspect {out_path} \"your sentence\" --out {out_path}-inspect")
    print(f"total time {figures['minutes_total']:.1f} min; figures in {out_path / 'demo.json'}")
    return figures
