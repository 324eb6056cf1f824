"""Every subcommand that takes a model × every family of model folder qkv reads: each pair either works
(exit 0, and its output is sane — checked against transformers where it can be) or is refused in ONE line
naming the problem and what the command accepts (exit 2, no traceback, not "an unexpected error").

The subcommands come from the command line's registry: a subcommand with a model argument (a positional
``model``/``models``/``src``/``run`` or ``--init-from``) and no row in :data:`EXPECTED` fails the walker,
and so does a row without an entry for a family. The folders (:mod:`models_support`) are written by
transformers' ``save_pretrained`` (BERT, DistilBERT, RoBERTa with its byte-level BPE tokenizer, GPT-2,
ViT, Marian) or by qkv (a masked LM, an image classifier), with random weights and tiny distinct sizes.

To add a family, add it to :data:`models_support.FAMILIES` and a column to every row; to add a command,
a row here and its arguments in :func:`_argv`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from models_support import FAMILIES, IMAGE_FAMILIES, MASK, build_families, build_inputs

from qkv.cli import build_parser, main

transformers = pytest.importorskip("transformers")

#: argument names (``dest``) that take a model folder
MODEL_ARGS = {"model", "models", "src", "run", "init_from"}
WORKS = "works"
ENCODERS = ("bert", "distilbert", "roberta", "qkv")


def refused(fragment: str) -> str:
    return "refused: " + fragment


def _row(default: str, **special: str) -> dict[str, str]:
    """A row of :data:`EXPECTED`: ``default`` for every family but those named (``qkv_vit`` for qkv-vit)."""
    return {f: special.get(f.replace("-", "_"), default) for f in FAMILIES}


NOT_ENCODER = "is not a text encoder; embeddings need an encoder or masked-LM folder"
ENCODER_ROW = dict.fromkeys(ENCODERS, WORKS)

#: command → family → WORKS or refused(fragment of the one line)
EXPECTED: dict[str, dict[str, str]] = {
    "convert": _row(WORKS, qkv_vit=refused("cannot be exported as a Hugging Face ViT: pooling='pooler'")),
    "export": _row(WORKS, vit=refused("an ImageClassifier has no text encoder to export; export takes a text model"),
                   qkv_vit=refused("an ImageClassifier has no text encoder to export; export takes a text model")),
    "pretrain": _row(WORKS, gpt2=refused("holds a causal LM; masked-LM pretraining needs an encoder (use --objective "
                                         "clm"),
                     marian=refused("holds an encoder-decoder; --objective mlm continues a text encoder"),
                     vit=refused("holds an image model; --objective mlm continues a text encoder"),
                     qkv_vit=refused("holds an image model; --objective mlm continues a text encoder")),
    "finetune": _row(refused("is an image model; qkv finetune trains a task head on a text encoder"), **ENCODER_ROW,
                     gpt2=refused("is a causal language model (GPT-style); qkv finetune trains a task head on an "
                                  "encoder"),
                     marian=refused("is an encoder-decoder; qkv finetune trains a task head on an encoder")),
    "predict": _row(refused("the model has no task head (it is a "), vit=WORKS, qkv_vit=WORKS),
    "analyze": _row(WORKS),
    "inspect": _row(WORKS),
    "findings": _row(refused("is an image model; findings measures text encoders"), **ENCODER_ROW,
                     gpt2=refused("holds a causal LM; the findings are measured on [CLS] … [SEP] encoders"),
                     marian=refused("holds an encoder-decoder; the findings are measured on [CLS] … [SEP] encoders")),
    "embed": _row(refused(NOT_ENCODER), **ENCODER_ROW),
    "index": _row(refused(NOT_ENCODER), **ENCODER_ROW),
    "train-embeddings": _row(refused("is not a text encoder; train-embeddings trains an encoder or masked-LM folder"),
                             **ENCODER_ROW),
    "eval-embeddings": _row(refused(NOT_ENCODER), **ENCODER_ROW),
    "generate": _row(refused("not a causal LM: generate needs a model folder of kind causal_lm"), gpt2=WORKS),
    "translate": _row(refused("not an encoder-decoder: translate needs a model folder of kind encoder_decoder"),
                      marian=refused("a translation tokenizer needs [PAD], [BOS], [EOS], [UNK] as ids 0-3, this one "
                                     "has [PAD]=None")),
    "caption": _row(refused("not a caption model: this is a")),
    "fill-mask": _row(refused("fill-mask needs a masked language model"), **ENCODER_ROW),
    "serve": _row(WORKS, vit=refused("has no tokenizer (tokenizer.json or vocab.txt); a served model reads text"),
                  qkv_vit=refused("has no tokenizer (tokenizer.json or vocab.txt); a served model reads text")),
}


def model_commands() -> set[str]:
    """The subcommands whose parser has a model argument (see :data:`MODEL_ARGS`)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name for name, p in sub.choices.items() if any(a.dest in MODEL_ARGS for a in p._actions)}


def _argv(command: str, family: str, folder: Path, inputs: dict[str, Path], out: Path) -> list[str]:
    image = family in IMAGE_FAMILIES
    f, docs, labelled, picture, o = str(folder), str(inputs["docs"]), str(inputs["labelled"]), str(inputs["picture"]), str(out)
    return {
        "convert": ["convert", f, o],
        "export": ["export", f, "--onnx", o + ".onnx"],
        "pretrain": ["pretrain", "--corpus", docs, "--out", o, "--init-from", f, "--steps", "1", "--warmup-steps", "1",
                     "--batch-size", "2", "--max-len", "16", "--eval-batches", "1", "--eval-batch-size", "2",
                     "--no-progress"],
        "finetune": ["finetune", f, "--task", "sequence-classification", "--train", labelled, "--out", o, "--steps", "1",
                     "--batch-size", "4", "--no-progress", "--baselines", "none"],
        "predict": ["predict", f, picture if image else docs, "--out", o + ".jsonl", "--no-progress"],
        "analyze": ["analyze", f, *(["--data", "dataset:digits:test", "--images", "4"] if image else
                                    ["--corpus", docs, "--max-docs", "3", "--no-parity"]),
                    "--out", o, "--quiet", "--ablation-contexts", "1"],
        "inspect": ["inspect", f, *([picture] if image else ["The cat sat on the mat.", "--methods", "raw", "--no-ablation",
                                                             "--no-importance"]), "--out", o],
        "findings": ["findings", "kobayashi", f, "--data", docs, "--out", o, "--texts", "3"],
        "embed": ["embed", f, docs, "--out", o + ".npy", "--no-progress"],
        "index": ["index", f, docs, "--out", o],
        "train-embeddings": ["train-embeddings", f, "--corpus", docs, "--out", o, "--steps", "1", "--batch-size", "2",
                             "--no-progress"],
        "eval-embeddings": ["eval-embeddings", f, "--dataset", labelled, "--out", o + ".json", "--no-progress"],
        "generate": ["generate", f, "The cat", "--max-new-tokens", "3", "--greedy", "--no-stream"],
        "translate": ["translate", f, "The cat sat.", "--max-new-tokens", "3"],
        "caption": ["caption", f, picture],
        "fill-mask": ["fill-mask", f, f"The {MASK.get(family, '[MASK]')} sat on the mat."],
        "serve": ["serve", f, "--port", "0"],
    }[command]


def _run_json(out: Path) -> str | None:
    status = json.loads((out / "run.json").read_text())["status"]
    return None if status == "complete" else f"run.json says {status}"


def _sane(command: str, family: str, folder: Path, out: Path, stdout: str) -> str | None:
    """Why the output of a pair that worked is not sane (None: it is)."""
    import qkv

    if command == "convert":
        return None if type(qkv.load(out).model) is type(qkv.load(folder).model) else "another model class"
    if command == "export":
        return None if Path(str(out) + ".onnx").stat().st_size > 0 else "an empty .onnx"
    if command in ("pretrain", "finetune"):
        return _run_json(out)
    if command == "train-embeddings":
        return None if qkv.load(out).model is not None else "no model"
    if command == "predict":
        rows = [json.loads(x) for x in Path(str(out) + ".jsonl").read_text().splitlines()]
        labels = set(qkv.load(folder).model.task.labels)
        return None if rows and all(r["label"] in labels for r in rows) else f"predictions {rows!r}"
    if command == "analyze":
        name = "attention_distance.json" if family in IMAGE_FAMILIES else "analysis.json"
        return None if (out / name).is_file() else f"no {name}"
    if command == "inspect":
        return None if (out / "viewer.html").is_file() else "no viewer.html"
    if command == "findings":
        return None if (out / "kobayashi.json").is_file() else "no kobayashi.json"
    if command == "embed":
        return _same_vectors(family, folder, np.load(str(out) + ".npy"))
    if command == "index":
        return None if (out / "index.json").is_file() else "no index.json"
    if command == "eval-embeddings":
        result = json.loads(Path(str(out) + ".json").read_text())
        return None if result else "an empty result"
    if command == "generate":
        return None if stdout.startswith("The cat") and len(stdout) > len("The cat") else f"printed {stdout!r}"
    if command == "fill-mask":
        return None if len(stdout.strip().splitlines()) == 6 else f"printed {stdout!r}"  # the text, 5 candidates
    if command == "serve":
        return None if f"model '{folder.name}'" in stdout else f"printed {stdout!r}"
    return f"no sanity check for {command}"


def _same_vectors(family: str, folder: Path, vectors: np.ndarray) -> str | None:
    """qkv embed's mean-pooled, normalised vectors against transformers' own model and tokenizer."""
    import torch
    from models_support import DOCS

    if vectors.shape[0] != len(DOCS) or not np.isfinite(vectors).all():
        return f"vectors of shape {vectors.shape}, finite {np.isfinite(vectors).all()}"
    if family == "qkv":
        return None  # no transformers twin; the qkv embedder has its own reference tests (tests/embeddings)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    batch = tok(DOCS, padding=True, return_tensors="pt")
    batch.pop("token_type_ids", None) if family == "distilbert" else None
    with torch.no_grad():
        h = model(**batch).last_hidden_state  # (B,T,C)
    mask = batch["attention_mask"][..., None].float()  # (B,T,1)
    want = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    gap = float(np.abs(vectors - want).max())
    return None if gap < 1e-5 else f"vectors differ from transformers' by {gap:.2e}"


@pytest.fixture(scope="module")
def families(tmp_path_factory, tokenizer, bpe_tok, model_folder) -> dict[str, Path]:
    return build_families(tmp_path_factory.mktemp("families"), tokenizer.backend, bpe_tok, model_folder)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return build_inputs(tmp_path_factory.mktemp("inputs"))


def test_every_model_command_has_a_row_for_every_family():
    commands = model_commands()
    assert commands >= {"embed", "finetune", "convert", "serve", "pretrain"}  # the derivation finds them
    assert commands <= set(EXPECTED), f"no row for: {sorted(commands - set(EXPECTED))}"
    assert set(EXPECTED) <= commands, f"rows of commands that take no model: {sorted(set(EXPECTED) - commands)}"
    missing = [f"{c} × {f}" for c, row in EXPECTED.items() for f in FAMILIES if f not in row]
    assert not missing, f"no recorded behaviour for: {missing}"


#: commands whose working pairs take a minute or more each on a 2-core CPU (the ONNX exporter and its check)
SLOW = {"export"}


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c
                                     for c in sorted(EXPECTED)])
def test_every_family_works_or_is_refused_in_one_line(command, families, inputs, tmp_path, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)  # serve: load, bind, announce
    failures = []
    for family in FAMILIES:
        want, out = EXPECTED[command][family], tmp_path / family
        try:
            code = main(_argv(command, family, families[family], inputs, out))
        except SystemExit as e:
            code = e.code
        captured = capsys.readouterr()
        err = [x for x in captured.err.splitlines() if x.strip()]
        errors = [x for x in err if x.startswith(f"qkv {command}: error:")]
        crashed = "Traceback" in captured.err or any("unexpected error" in x for x in err)
        if want == WORKS:
            why = (f"exit {code}" if code != 0 or crashed else
                   _sane(command, family, families[family], out, captured.out))
            if why:
                failures.append(f"{family}: expected to work: {why}; stderr {captured.err[-400:]!r}")
        elif code != 2 or crashed or len(errors) != 1 or want.removeprefix("refused: ") not in errors[0]:
            failures.append(f"{family}: expected one line with {want.removeprefix('refused: ')!r}; exit {code}, "
                            f"stderr {captured.err[-400:]!r}")
    assert not failures, f"qkv {command}:\n" + "\n".join(failures)
