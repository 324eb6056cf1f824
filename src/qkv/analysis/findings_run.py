"""``qkv findings NAME MODEL --data SPEC --out DIR``: one of the three published findings of
:mod:`qkv.analysis.findings` measured on a model folder, written as ``NAME.json`` (every number),
``NAME.md`` (the table, beside the paper's own figures) and ``NAME.png`` / ``NAME.svg``.

Texts are a seeded sample of ``--data`` (``dataset:NAME[:SPLIT]``, a file or a folder), cut to the first
``max_len`` tokens. ``abnar`` and ``michel`` need a sequence classifier whose labels the data's labels
are (a named dataset's, or the ``label`` field of JSONL records); ``michel`` estimates importance on one half
of the sample and measures accuracy on the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.capture import model_window
from qkv.analysis.figures import abnar_figure, head_grid_figure, kobayashi_figure, michel_figure
from qkv.analysis.findings import TARGETS, abnar_zuidema, kobayashi_shares, michel_pruning
from qkv.analysis.hooked import Batch, encode_texts
from qkv.analysis.inputs import AnalysisInputError, model_and_tokenizer, read_corpus
from qkv.analysis.inspect_methods import is_qkv
from qkv.analysis.seq2seq_inspect import output_folder
from qkv.models.causal_lm import CausalLM
from qkv.models.seq2seq import EncoderDecoder
from qkv.models.task_models import SequenceClassifier

__all__ = ["FINDINGS", "PAPER", "run_findings"]

#: The findings ``qkv findings`` reproduces.
FINDINGS = ("abnar", "michel", "kobayashi")
#: What each paper reports, in one line (quoted beside qkv's table).
PAPER = {
    "abnar": "Abnar & Zuidema 2020 (6-layer model, subject-verb agreement): raw attention's rank correlation with "
             "blank-out importance about 0.69 in the first layer, falling to about −0.1 by the third; rollout and "
             "flow stay near 0.7 in every layer.",
    "michel": "Michel et al. 2019 (BERT-base on MNLI): about 40% of the heads can be pruned, least important first, "
              "without a noticeable loss of accuracy; many heads can be removed alone with no loss at all.",
    "kobayashi": "Kobayashi et al. 2020 (BERT-base): heads put much of their weight α on [SEP], [CLS] and "
                 "punctuation, especially in middle layers, but those tokens' transformed vectors f(x) are small, so "
                 "by the norm ‖αf(x)‖ most of that attention vanishes.",
}
_CHUNK = 32  # texts per forward pass


def _check_classifier(model) -> None:
    if not isinstance(model, SequenceClassifier) or model.task.task != "sequence-classification":
        raise AnalysisInputError("this finding needs a sequence classifier (a folder written by qkv finetune "
                                 "--task sequence-classification)")


def _labelled(model, documents) -> tuple[list[str], torch.Tensor]:
    _check_classifier(model)
    ids = {name: i for i, name in enumerate(model.task.labels)}
    unknown = sorted({str(y) for y in documents.labels if y not in ids}) if documents.labels else ["(no labels)"]
    if unknown:
        raise AnalysisInputError(f"the data's labels {unknown[:3]} are not the model's {list(model.task.labels)[:8]}; "
                                 "give the labelled data it was fine-tuned on (e.g. dataset:reuters8:test)")
    return list(documents.texts), torch.tensor([ids[y] for y in documents.labels])


def _pairs(tokenizer, texts: list[str], labels: torch.Tensor, max_len: int) -> list[tuple[Batch, torch.Tensor]]:
    return [(encode_texts(tokenizer, texts[i:i + _CHUNK], max_len=max_len, truncate=True), labels[i:i + _CHUNK])
            for i in range(0, len(texts), _CHUNK)]


def _run(name: str, model, tokenizer, data, *, n_texts: int, max_len: int, seed: int, step: int, single: bool,
         flow: bool, target: str):
    """The finding's result and its figures ``{stem: Figure}``."""
    documents = read_corpus(data, max_docs=n_texts if name != "michel" else 2 * n_texts, seed=seed,
                            label_field=None if name == "kobayashi" else "label")
    if name == "kobayashi":
        r = kobayashi_shares(model, encode_texts(tokenizer, documents.texts, max_len=max_len, truncate=True))
        return r, {"kobayashi": kobayashi_figure(r)}
    texts, labels = _labelled(model, documents)
    if name == "abnar":
        batch = encode_texts(tokenizer, texts, max_len=max_len, truncate=True)
        r = abnar_zuidema(model, batch, replacement_id=tokenizer.unk_id, flow=flow, labels=labels, target=target)
        return r, {"abnar": abnar_figure(r)}
    half = len(texts) // 2
    if half < 1:
        raise AnalysisInputError("michel needs at least 2 labelled texts (one half ranks heads, the other scores)")
    r = michel_pruning(model, _pairs(tokenizer, texts[half:], labels[half:], max_len),
                       _pairs(tokenizer, texts[:half], labels[:half], max_len), step=step, single=single)
    pruned = r.order[: r.prunable]
    return r, {"michel": michel_figure(r), "michel_importance": head_grid_figure(
        r.importance, f"head importance (outlined: the {len(pruned)} pruned within 1 point)", "importance",
        marks=pruned)}


def _markdown(name: str, result, model_name: str, data) -> str:
    header, rows = result.table()
    lines = [f"# qkv findings {name} — {model_name}", "", f"Data: {data}. {_describe(name, result)}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"The paper: {PAPER[name]}", "", f"![{name}]({name}.png)", ""]
    return "\n".join(lines)


def _describe(name: str, r) -> str:
    if name == "abnar":
        acc = "" if r.accuracy is None else f" (the model's accuracy on them {r.accuracy:.3f})"
        return (f"{r.n_texts} texts{acc}; Spearman correlation with blank-out importance (the drop of the "
                f"predicted class's {r.target} when a token becomes [UNK]) over each text's "
                f"content tokens, at the rows the classifier reads ({r.queries}), mean ± std over texts; top-1: the "
                f"share of texts whose most important token is the view's largest (chance {r.chance:.2f}).")
    if name == "michel":
        return (f"Importance on {r.n_importance} texts, accuracy on {r.n_eval} others; {r.prunable} of "
                f"{r.importance.size} heads ({r.prunable / r.importance.size:.0%}) pruned with accuracy at most "
                f"{r.tolerance:.0%} below the intact {r.accuracy[0]:.4f}.")
    return (f"{r.n_texts} texts, {r.n_tokens} tokens; shares of [CLS] / [SEP] / punctuation among the keys: "
            + " / ".join(f"{x:.3f}" for x in r.token_share[:3]) + ". Mean share of each query's attention.")


def run_findings(name: str, model_path, data, out_dir: str | Path, *, n_texts: int = 64, max_len: int | None = None,
                 seed: int = 0, step: int = 4, single: bool = False, flow: bool = True, target: str = "probability"):
    """Measure finding ``name`` (one of :data:`FINDINGS`) on a model folder and write it into ``out_dir``.

    Returns:
        ``(result, paths)``: the finding's dataclass and ``{"json", "md", stem: png, stem_svg: svg}``.

    Raises:
        AnalysisInputError: an unknown finding, a model that is not a qkv model, unsuitable data.
    """
    if name not in FINDINGS:
        raise AnalysisInputError(f"unknown finding {name!r}; choose one of {', '.join(FINDINGS)}")
    if target not in TARGETS:
        raise AnalysisInputError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if n_texts < 2 or (max_len is not None and max_len < 4) or step < 1:
        raise AnalysisInputError(f"need texts ≥ 2, max_len ≥ 4 and step ≥ 1; got {n_texts}, {max_len}, {step}")
    model, tokenizer, model_name = model_and_tokenizer(model_path)
    if not is_qkv(model):
        raise AnalysisInputError("qkv findings needs a qkv model (the hooks); load the folder with qkv.load")
    if isinstance(model, (CausalLM, EncoderDecoder)):
        raise AnalysisInputError(f"{model_name} holds {'a causal LM' if isinstance(model, CausalLM) else 'an encoder-decoder'}"
                                 "; the findings are measured on [CLS] … [SEP] encoders (a masked LM, an encoder, "
                                 "a sequence classifier)")
    if name != "kobayashi":  # the model's kind first: a masked LM is the wrong model at any --max-len
        _check_classifier(model)
    window = model_window(model)
    if max_len is None:  # the default: 64 tokens, or the model's window where it is shorter
        max_len = min(64, window or 64)
    elif window is not None and max_len > window:
        raise AnalysisInputError(f"max_len={max_len} (--max-len) is above the model's window of {window} positions; "
                                 f"choose --max-len {window} or less")
    model.eval()
    result, figures = _run(name, model, tokenizer, data, n_texts=n_texts, max_len=max_len, seed=seed, step=step,
                           single=single, flow=flow, target=target)
    out = output_folder(out_dir)
    paths: dict[str, Path] = {}
    for stem, fig in figures.items():
        saved = plots.save_formats(fig, out / stem, ("png", "svg"))
        paths[stem], paths[f"{stem}_svg"] = saved["png"], saved["svg"]
    record = {**result.to_dict(), "model": model_name, "data": data if isinstance(data, str) else list(data),
              "n_texts": n_texts, "max_len": max_len, "seed": seed, "paper": PAPER[name]}
    paths["json"], paths["md"] = out / f"{name}.json", out / f"{name}.md"
    atomic_write_text(paths["json"], json.dumps(record, indent=1, default=_plain) + "\n")
    atomic_write_text(paths["md"], _markdown(name, result, Path(str(model_name)).name, data))
    return result, paths


def _plain(x):
    """JSON for NumPy scalars (nan as null)."""
    if isinstance(x, np.generic):
        v = x.item()
        return None if isinstance(v, float) and v != v else v
    raise TypeError(f"not JSON: {type(x).__name__}")
