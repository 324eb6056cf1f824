"""Every subcommand with bad arguments: one clear ``qkv <command>: error:`` line, a non-zero exit,
no Python traceback (unless ``--debug``) — and so is a ``--plugin`` module that cannot be imported. To
add a case, add a row to :func:`_cases`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


from qkv.cli import build_parser, main


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors (unknown option, bad type): exit 2 with usage
        code = e.code
    return code, capsys.readouterr().err


def _cases(tmp: Path, model: Path) -> dict[str, list[str]]:
    afile = tmp / "afile"
    afile.write_text("x")
    cfg_list, cfg_types, cfg_bad = tmp / "list.json", tmp / "types.json", tmp / "bad.json"
    cfg_list.write_text("[1, 2]")
    cfg_types.write_text(json.dumps({"corpus": ["dataset:pydoc"], "lr": "fast"}))
    cfg_bad.write_text("{oops")
    user = tmp / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("mine")
    text = tmp / "docs.txt"
    text.write_text("one document\nanother one\n")
    nowhere = str(tmp / "nowhere")
    rows = tmp / "rows.jsonl"
    rows.write_text("".join(f'{{"text": "document {i}", "label": {i}.5}}\n' for i in range(8)))
    clm = tmp / "clm"
    if not clm.exists():
        import torch

        from qkv.checkpoints.io import load, save
        from qkv.config import ModelConfig
        from qkv.models.builders import build_causal_lm

        torch.manual_seed(0)
        tok = load(model).tokenizer
        save(build_causal_lm(ModelConfig.preset("tiny", vocab_size=tok.get_vocab_size(), type_vocab_size=0,
                                                pad_token_id=None, norm="pre", max_len=32)), clm, tokenizer=tok)
    vit, pic, big = _image_inputs(tmp)
    return {
        "predict a picture to a text model": ["predict", str(model), str(pic), "--out", str(tmp / "p.jsonl")],
        "predict text to an image model": ["predict", str(vit), str(text), "--out", str(tmp / "p.jsonl")],
        "predict a picture of another size": ["predict", str(vit), str(big), "--out", str(tmp / "p.jsonl")],
        "predict an empty picture": ["predict", str(vit), str(afile.with_suffix(".png")), "--out",
                                     str(tmp / "p.jsonl")],
        "predict a folder without pictures": ["predict", str(vit), str(user), "--out", str(tmp / "p.jsonl")],
        "inspect a picture to a text model": ["inspect", str(model), str(pic), "--out", str(tmp / "i")],
        "inspect text to an image model": ["inspect", str(vit), "a cat", "--out", str(tmp / "i")],
        "inspect a picture of another size": ["inspect", str(vit), str(big), "--out", str(tmp / "i")],
        "inspect --patch outside": ["inspect", str(vit), str(pic), "--out", str(tmp / "i"), "--patch", "9,9"],
        "inspect --patch for text": ["inspect", str(model), "text", "--out", str(tmp / "i"), "--patch", "1,1"],
        "analyze an image model without --data": ["analyze", str(vit), "--out", str(tmp / "a")],
        "analyze an image model with --corpus": ["analyze", str(vit), "--corpus", "dataset:pydoc", "--out",
                                                 str(tmp / "a")],
        "analyze --data for a text model": ["analyze", str(model), "--data", "dataset:digits", "--out", str(tmp / "a")],
        "analyze no corpus": ["analyze", str(model), "--out", str(tmp / "a")],
        "analyze --images 0": ["analyze", str(vit), "--data", "dataset:digits:test", "--images", "0", "--out",
                               str(tmp / "a")],
        "lab image-positions --seeds 0": ["lab", "image-positions", "--out", str(tmp / "l"), "--seeds", "0"],
        "lab image-positions --variants bad": ["lab", "image-positions", "--out", str(tmp / "l"), "--variants", "x"],
        "lab image-positions --model bad": ["lab", "image-positions", "--out", str(tmp / "l"), "--model", "{oops"],
        "lab image-positions --steps 0": ["lab", "image-positions", "--out", str(tmp / "l"), "--steps", "0"],
        "lab image-positions --out user files": ["lab", "image-positions", "--out", str(user)],
        "demo --minutes nan": ["demo", "--minutes", "nan", "--out", str(tmp / "d")],
        "demo --minutes -1": ["demo", "--minutes", "-1", "--out", str(tmp / "d")],
        "demo --out a file": ["demo", "--out", str(afile)],
        "demo --out under a file": ["demo", "--out", str(afile / "run")],
        "demo --out user files": ["demo", "--out", str(user)],
        "demo --minutes text": ["demo", "--minutes", "soon"],
        "convert missing src": ["convert", nowhere, str(tmp / "c")],
        "convert src a file": ["convert", str(afile), str(tmp / "c")],
        "convert dst a file": ["convert", str(model), str(afile)],
        "convert dst user files": ["convert", str(model), str(user)],
        "convert --to bad": ["convert", str(model), str(tmp / "c"), "--to", "onnx"],
        "export missing model": ["export", nowhere, "--onnx", str(tmp / "m.onnx")],
        "export out a folder": ["export", str(model), "--onnx", str(user)],
        "export out exists": ["export", str(model), "--onnx", str(afile)],
        "export bad opset": ["export", str(model), "--onnx", str(tmp / "m.onnx"), "--opset", "3"],
        "export bad pipeline": ["export", str(model), "--onnx", str(tmp / "m.onnx"), "--pipeline", "rerank"],
        "export --pooling without embeddings": ["export", str(model), "--onnx", str(tmp / "m.onnx"), "--pooling",
                                                "mean"],
        "export classifier of an encoder": ["export", str(model), "--onnx", str(tmp / "m.onnx"), "--pipeline",
                                            "classifier", "--no-check"],
        "export out under a file": ["export", str(model), "--onnx", str(afile / "m.onnx")],
        "finetune no train": ["finetune", str(model), "--task", "regression", "--out", str(tmp / "f")],
        "finetune no task": ["finetune", str(model), "--train", "dataset:reuters8", "--out", str(tmp / "f")],
        "finetune bad task": ["finetune", str(model), "--task", "qa", "--train", "dataset:reuters8", "--out",
                              str(tmp / "f")],
        "finetune missing model": ["finetune", nowhere, "--task", "sequence-classification", "--train",
                                   "dataset:reuters8", "--out", str(tmp / "f")],
        "finetune missing train": ["finetune", str(model), "--task", "sequence-classification", "--train", nowhere,
                                   "--out", str(tmp / "f")],
        "finetune text file": ["finetune", str(model), "--task", "sequence-classification", "--train", str(text),
                               "--out", str(tmp / "f")],
        "finetune --out user files": ["finetune", str(model), "--task", "sequence-classification", "--train",
                                      "dataset:reuters8", "--out", str(user)],
        "finetune --baselines bad": ["finetune", str(model), "--task", "sequence-classification", "--train",
                                     "dataset:reuters8", "--out", str(tmp / "f"), "--baselines", "bm25"],
        "finetune --epochs 0": ["finetune", str(model), "--task", "sequence-classification", "--train",
                                "dataset:reuters8", "--out", str(tmp / "f"), "--epochs", "0"],
        "predict missing run": ["predict", nowhere, str(text), "--out", str(tmp / "p.jsonl")],
        "predict no head": ["predict", str(model), str(text), "--out", str(tmp / "p.jsonl")],
        "predict --batch-size 0": ["predict", str(model), str(text), "--out", str(tmp / "p.jsonl"), "--batch-size", "0"],
        "predict --batch-tokens 0": ["predict", str(model), str(text), "--out", str(tmp / "p.jsonl"),
                                     "--batch-tokens", "0"],
        "predict --precision fp16": ["predict", str(model), str(text), "--out", str(tmp / "p.jsonl"),
                                     "--precision", "fp16"],
        "pretrain no corpus": ["pretrain", "--out", str(tmp / "r")],
        "pretrain --config missing": ["pretrain", "--out", str(tmp / "r"), "--config", nowhere],
        "pretrain --config list": ["pretrain", "--out", str(tmp / "r"), "--config", str(cfg_list)],
        "pretrain --config types": ["pretrain", "--out", str(tmp / "r"), "--config", str(cfg_types)],
        "pretrain --config bad json": ["pretrain", "--out", str(tmp / "r"), "--config", str(cfg_bad)],
        "pretrain --model bad json": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                      "--model", "{x"],
        "pretrain --model list": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"), "--model", "[]"],
        "pretrain --select-rate 0": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                     "--select-rate", "0"],
        "pretrain --device banana": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                     "--device", "banana"],
        "pretrain --objective bad": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                     "--objective", "gpt"],
        "pretrain clm with --whole-word": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                           "--objective", "clm", "--whole-word"],
        "pretrain --vocab-size absurd": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                         "--vocab-size", "1000000000"],
        "pretrain model too large": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"), "--preset",
                                     "tiny", "--max-len", "24", "--vocab-size", "300", "--model",
                                     '{"max_len": 100000000}'],
        "pretrain translation wrong corpus": ["pretrain", "--objective", "translation", "--corpus", "dataset:pydoc",
                                              "--out", str(tmp / "r")],
        "pretrain translation --mask-rate": ["pretrain", "--objective", "translation", "--corpus",
                                             "dataset:bible-en-es", "--out", str(tmp / "r"), "--mask-rate", "0.5"],
        "pretrain image with --corpus": ["pretrain", "--objective", "image", "--corpus", "dataset:pydoc",
                                         "--out", str(tmp / "r")],
        "pretrain mlm with --augment": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                        "--augment", "flip"],
        "pretrain image --augment bad": ["pretrain", "--objective", "image", "--preset", "vit-digits",
                                         "--augment", "rotate", "--out", str(tmp / "r")],
        "pretrain image --data nowhere": ["pretrain", "--objective", "image", "--preset", "vit-digits",
                                          "--data", nowhere, "--out", str(tmp / "r")],
        "pretrain caption --augment": ["pretrain", "--objective", "caption", "--augment", "flip", "--out",
                                       str(tmp / "r")],
        "pretrain caption with --corpus": ["pretrain", "--objective", "caption", "--corpus", "dataset:pydoc",
                                           "--out", str(tmp / "r")],
        "pretrain caption --preset vit-digits": ["pretrain", "--objective", "caption", "--preset", "vit-digits",
                                                 "--out", str(tmp / "r")],
        "pretrain caption --data nowhere": ["pretrain", "--objective", "caption", "--data", nowhere, "--out",
                                            str(tmp / "r")],
        "pretrain --steps 0": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"), "--steps", "0"],
        "pretrain --strategy bad": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"),
                                    "--strategy", "zero3"],
        "pretrain --lr nan": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp / "r"), "--lr", "nan"],
        "pretrain --resume no run": ["pretrain", "--out", nowhere, "--resume"],
        "pretrain --out under a file": ["pretrain", "--corpus", "dataset:pydoc", "--out", str(afile / "r")],
        "pretrain missing corpus": ["pretrain", "--corpus", nowhere, "--out", str(tmp / "r")],
        "pretrain unknown dataset": ["pretrain", "--corpus", "dataset:wikipedia", "--out", str(tmp / "r")],
        "pretrain unknown option": ["pretrain", "--out", str(tmp / "r"), "--time-travel"],
        "analyze missing model": ["analyze", nowhere, "--corpus", "dataset:pydoc", "--out", str(tmp / "a")],
        "analyze missing corpus": ["analyze", str(model), "--corpus", nowhere, "--out", str(tmp / "a"), "--quiet"],
        "analyze --precision fp16": ["analyze", str(model), "--corpus", "dataset:pydoc", "--out", str(tmp / "a"),
                                     "--precision", "fp16"],
        "inspect missing model": ["inspect", nowhere, "text", "--out", str(tmp / "i")],
        "analyze --ablation-contexts -1": ["analyze", str(model), "--corpus", "dataset:pydoc", "--out",
                                           str(tmp / "a"), "--ablation-contexts", "-1"],
        "inspect --format gif": ["inspect", str(model), "text", "--out", str(tmp / "i"), "--format", "gif"],
        "inspect --methods rolout": ["inspect", str(model), "text", "--out", str(tmp / "i"), "--methods", "rolout"],
        "findings missing model": ["findings", "kobayashi", nowhere, "--data", "dataset:pydoc", "--out", str(tmp / "f")],
        "findings unknown finding": ["findings", "rollout", str(model), "--data", "dataset:pydoc", "--out",
                                     str(tmp / "f")],
        "findings abnar on a masked LM": ["findings", "abnar", str(model), "--data", "dataset:reuters8:test",
                                          "--out", str(tmp / "f"), "--texts", "2"],
        "findings --texts 1": ["findings", "kobayashi", str(model), "--data", "dataset:pydoc", "--out", str(tmp / "f"),
                               "--texts", "1"],
        "inspect --flow-max-tokens 0": ["inspect", str(model), "text", "--out", str(tmp / "i"),
                                        "--flow-max-tokens", "0"],
        "embed missing model": ["embed", nowhere, str(text), "--out", str(tmp / "e.npy")],
        "embed bad suffix": ["embed", str(model), str(text), "--out", str(tmp / "e.xls")],
        "embed --out under a file": ["embed", str(model), str(text), "--out", str(afile / "e.npy")],
        "embed missing input": ["embed", str(model), nowhere, "--out", str(tmp / "e.npy")],
        "embed --device banana": ["embed", str(model), str(text), "--out", str(tmp / "e.npy"), "--device", "banana"],
        "index missing model": ["index", nowhere, str(text), "--out", str(tmp / "ix")],
        "index --out user files": ["index", str(model), str(text), "--out", str(user)],
        "index --index bad": ["index", str(model), str(text), "--out", str(tmp / "ix"), "--index", "annoy"],
        "index --nlist for exact": ["index", str(model), str(text), "--out", str(tmp / "ix"), "--nlist", "8"],
        "index --nprobe 0": ["index", str(model), str(text), "--out", str(tmp / "ix"), "--index", "faiss-ivf",
                             "--nprobe", "0"],
        "search not an index": ["search", str(tmp), "query"],
        "search -k 0": ["search", str(tmp), "query", "-k", "0"],
        "train-embeddings missing model": ["train-embeddings", nowhere, "--corpus", str(text), "--out",
                                           str(tmp / "t")],
        "eval-embeddings --k 0": ["eval-embeddings", str(model), "--dataset", "reuters8", "--k", "0"],
        "eval-embeddings --out under a file": ["eval-embeddings", str(model), "--dataset", "reuters8",
                                               "--out", str(afile / "r.json")],
        "eval-embeddings unknown dataset": ["eval-embeddings", str(model), "--dataset", "nope"],
        "ablate unknown grid": ["ablate", "--grid", "nope", "--corpus", "dataset:pydoc", "--out", str(tmp / "ab")],
        "ablate no corpus": ["ablate", "--grid", "heads"],
        "ablate unknown grid, no corpus": ["ablate", "--grid", "nope", "--out", str(tmp / "ab")],
        "generate missing model": ["generate", nowhere, "hello"],
        "generate not a causal lm": ["generate", str(model), "hello", "--greedy"],
        "generate --max-new-tokens 0": ["generate", str(model), "hello", "--max-new-tokens", "0"],
        "generate --top-p 2": ["generate", str(model), "hello", "--top-p", "2"],
        "generate --temperature 0": ["generate", str(model), "hello", "--temperature", "0"],
        "generate --top-k 0": ["generate", str(model), "hello", "--top-k", "0"],
        "generate --greedy --top-k": ["generate", str(model), "hello", "--greedy", "--top-k", "5"],
        "generate no prompt": ["generate", str(model)],
        "lab seq2seq --max-len absurd": ["lab", "seq2seq", "--task", "reverse", "--out", str(tmp / "l"),
                                         "--max-len", "100000000"],
        "translate missing model": ["translate", nowhere, "hello"],
        "translate not an encoder-decoder": ["translate", str(model), "hello"],
        "translate no text": ["translate", str(model)],
        "translate --beams 0": ["translate", str(model), "hello", "--beams", "0"],
        "translate --input missing": ["translate", str(model), "--input", nowhere],
        "translate --max-new-tokens 0": ["translate", str(model), "hello", "--max-new-tokens", "0"],
        "caption missing model": ["caption", nowhere, str(text)],
        "caption not a caption model": ["caption", str(model), str(text)],
        "caption --max-new-tokens 0": ["caption", str(model), str(text), "--max-new-tokens", "0"],
        "lab seq2seq --steps 0": ["lab", "seq2seq", "--task", "reverse", "--out", str(tmp / "l"), "--steps", "0"],
        "lab seq2seq --minutes -1": ["lab", "seq2seq", "--task", "reverse", "--out", str(tmp / "l"), "--minutes", "-1"],
        "lab seq2seq --symbols 99": ["lab", "seq2seq", "--task", "sort", "--out", str(tmp / "l"), "--symbols", "99"],
        "lab seq2seq --min-len 0": ["lab", "seq2seq", "--task", "reverse", "--out", str(tmp / "l"), "--min-len", "0"],
        "lab seq2seq --out a file": ["lab", "seq2seq", "--task", "reverse", "--out", str(afile), "--steps", "1"],
        "lab seq2seq --out under a file": ["lab", "seq2seq", "--task", "reverse", "--out", str(afile / "r"),
                                           "--steps", "1"],
        "finetune a causal lm": ["finetune", str(clm), "--task", "regression", "--train", str(rows), "--out",
                                 str(tmp / "f")],
        "serve missing model": ["serve", nowhere],
        "serve --port 70000": ["serve", str(model), "--port", "70000"],
        "serve --max-texts 0": ["serve", str(model), "--max-texts", "0"],
        "serve --precision fp16": ["serve", str(model), "--precision", "fp16"],
        "serve --index missing": ["serve", str(model), "--index", nowhere],
        "serve a file as model": ["serve", str(afile)],
        "fill-mask missing model": ["fill-mask", nowhere, "a [MASK]"],
        "fill-mask no mask token": ["fill-mask", str(model), "no blank here"],
        "fill-mask --top-k 0": ["fill-mask", str(model), "a [MASK]", "--top-k", "0"],
        "fill-mask no text": ["fill-mask", str(model)],
        "fill-mask bundled name missing": ["fill-mask", "minilm-not-bundled", "a [MASK]"],
    }


def _image_inputs(tmp: Path) -> tuple[Path, Path, Path]:
    """A tiny image classifier folder (8×8 grey pictures), a picture of its size and one of another size."""
    import numpy as np
    import torch
    from PIL import Image

    from qkv.checkpoints.io import save
    from qkv.models.heads import TaskConfig
    from qkv.models.vision_builders import build_image_classifier
    from qkv.vision.config import model_config

    vit, pic, big = tmp / "vit", tmp / "pic.png", tmp / "big.png"
    if not vit.exists():
        torch.manual_seed(0)
        save(build_image_classifier(model_config("vit-digits", {"image": {"patch": 2}}, n_layers=1),
                                    TaskConfig("sequence-classification", ("a", "b"))), vit)
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(pic)
        Image.fromarray(np.zeros((9, 8), np.uint8)).save(big)
        (tmp / "afile.png").write_bytes(b"")
    return vit, pic, big


def test_every_subcommand_is_covered(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    covered = {name.split()[0] for name in _cases(tmp_path, model_folder)}
    assert commands <= covered, sorted(commands - covered)


def test_bad_arguments_give_one_clear_line_and_no_traceback(tmp_path, model_folder, capsys):
    failures = []
    for name, argv in _cases(tmp_path, model_folder).items():
        code, err = _run(argv, capsys)
        command = argv[0]
        lines = [x for x in err.splitlines() if x.startswith(f"qkv {command}: error:")]
        if code in (0, None) or "Traceback" in err or len(lines) != 1 or len(lines[0]) < 30:
            failures.append(f"{name}: exit {code}, stderr {err[-400:]!r}")
    assert not failures, "\n".join(failures)
    assert (tmp_path / "user" / "thesis.tex").read_text() == "mine"


def _expected() -> dict[str, str]:
    """Cases whose one line must hold a fragment naming the problem (the "vague" class): every subcommand
    has at least one (:func:`test_every_subcommand_has_a_message_case`)."""
    return {
        "pretrain --select-rate 0": "select_rate",
        "pretrain --objective bad": "objective",
        "pretrain clm with --whole-word": "--whole-word",
        "pretrain --config types": "lr='fast' must be a number",
        "pretrain --config missing": "no such file",
        "pretrain --config list": "expected a JSON object",
        "pretrain --device banana": "device",
        "pretrain --strategy bad": "strategy='zero3' is not allowed; allowed: ddp, fsdp",
        "index --nlist for exact": "--nlist: not a parameter of --index exact",
        "index --nprobe 0": "nprobe=0 must be an int ≥ 1",
        "demo --out user files": "was not made by qkv demo; it is left untouched",
        "eval-embeddings --k 0": "--k 0",
        "eval-embeddings --out under a file": "is a file, not a folder",
        "embed --device banana": "'banana' is not a device",
        "finetune no train": "--train is required",
        "serve missing model": "model folder not found",
        "finetune a causal lm": "is a causal language model (GPT-style); qkv finetune trains a task head",
        "serve --port 70000": "port=70000 must be in [0, 65535]",
        "serve --index missing": "index folder not found",
        "finetune text file": "unknown format",
        "finetune --out user files": "not an empty folder",
        "predict no head": "no task head",
        "predict a picture to a text model": "is a text model; it reads text, not pictures",
        "predict text to an image model": "not a PNG or JPEG picture",
        "predict a picture of another size": "the picture is 8×9 pixels but the model reads 8×8",
        "predict an empty picture": "the file is empty",
        "predict a folder without pictures": "holds no PNG/JPEG pictures",
        "inspect a picture to a text model": "is a text model; it reads text, not pictures",
        "inspect text to an image model": "is an image model; give it one picture file",
        "inspect a picture of another size": "but the model reads 8×8",
        "inspect --patch outside": "outside the model's 4×4 grid",
        "analyze an image model without --data": "not an image run folder",
        "analyze --data for a text model": "--data is for image models",
        "analyze no corpus": "--corpus is required",
        "lab image-positions --seeds 0": "--seeds 0",
        "lab image-positions --out user files": "did not write",
        "predict --batch-tokens 0": "--batch-tokens 0 must be ≥ 1",
        "generate not a causal lm": "not a causal LM",
        "generate --top-p 2": "--top-p must be in (0, 1]",
        "generate --temperature 0": "--temperature must be > 0",
        "generate --max-new-tokens 0": "--max-new-tokens 0",
        "translate not an encoder-decoder": "not an encoder-decoder",
        "pretrain translation wrong corpus": "dataset:bible-en-es or dataset:bible-es-en",
        "pretrain translation --mask-rate": "--mask-rate: not option(s) of --objective translation",
        "translate --beams 0": "--beams 0",
        "translate no text": "either as TEXT arguments or as --input FILE",
        "caption not a caption model": "not a caption model",
        "pretrain caption --augment": "--augment: image-classification option(s), not used by --objective caption",
        "pretrain caption with --corpus": "--corpus: text option(s), not used by --objective caption",
        "pretrain caption --preset vit-digits": "unknown caption recipe",
        "pretrain caption --data nowhere": "captioning trains on dataset:fashion-captions",
        "lab seq2seq --symbols 99": "n_symbols",
        "ablate unknown grid, no corpus": "unknown grid 'nope'",
        "lab seq2seq --max-len absurd": "max_len=100,000,000 is above 1,024",
        "pretrain --vocab-size absurd": "choose a smaller --vocab-size",
        "pretrain model too large": "the largest tensor is encoder.embeddings.positions.weight, 100000000 × ",
        "lab seq2seq --out a file": "is not a folder",
        "fill-mask no mask token": "text 0 has no [MASK] (this model's mask token)",
        "fill-mask --top-k 0": "--top-k 0: give at least 1",
        "export --pooling without embeddings": "add --pipeline embeddings",
        "export classifier of an encoder": "pipeline 'classifier' needs a model with a task head",
        "export out under a file": "is a file, not a folder",
        "convert missing src": "does not exist (not a folder); give the folder of a qkv, Hugging Face",
        "convert dst user files": "holds files that are not part of a model (thesis.tex)",
        "analyze --ablation-contexts -1": "ablation_contexts=-1 must be ≥ 0",
        "inspect --methods rolout": "--methods 'rolout': allowed raw, value_norm, rollout, flow",
        "findings abnar on a masked LM": "this finding needs a sequence classifier",
        "search not an index": "is not an index folder made by `qkv index`",
        "train-embeddings missing model": "does not exist (not a folder)",
    }


def test_every_subcommand_has_a_message_case(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    cases = _cases(tmp_path, model_folder)
    assert set(_expected()) <= set(cases)
    named = {cases[name][0] for name in _expected()}
    assert commands <= named, f"no case naming its message for: {sorted(commands - named)}"


def test_messages_name_the_problem(tmp_path, model_folder, capsys):
    cases = _cases(tmp_path, model_folder)
    for name, fragment in _expected().items():
        code, err = _run(cases[name], capsys)
        assert code == 2 and fragment in err, (name, err)
        assert "learning rate" not in err or name != "pretrain --select-rate 0"


def test_corpus_as_a_string_in_config_is_one_spec(tmp_path):
    from qkv.training.config import TrainConfig

    cfg = TrainConfig.from_dict({"corpus": "small.txt", "out": str(tmp_path / "r")})
    assert cfg.corpus == ("small.txt",)


def test_traceback_only_with_debug_in_a_real_process(tmp_path):
    import os

    cmd = [sys.executable, "-m", "qkv", "pretrain", "--out", str(tmp_path / "r"), "--config", str(tmp_path / "no")]
    env = {k: v for k, v in os.environ.items() if k != "QKV_DEBUG"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"qkv pretrain: error: --config {tmp_path / 'no'}: no such file"]
    r = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr
    r = subprocess.run(cmd, capture_output=True, text=True, env={**env, "QKV_DEBUG": "1"})
    assert "Traceback" in r.stderr


def test_demo_never_deletes_a_folder_it_did_not_make(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"format": "qkv-run", "train_config": {"corpus": ["mine.txt"]}}))
    code, err = _run(["demo", "--out", str(run)], capsys)
    assert code == 2 and "not made by qkv demo" in err and (run / "run.json").is_file()
    (run / ".qkv-demo").write_text("{}")  # the demo's mark, but a file the demo did not write
    (run / "notes.txt").write_text("keep me")
    code, err = _run(["demo", "--out", str(run)], capsys)
    assert code == 2 and "notes.txt" in err and (run / "notes.txt").read_text() == "keep me"


def test_every_subcommand_takes_plugin_and_names_a_module_it_cannot_import(tmp_path, model_folder, capsys):
    """``--plugin MODULE`` on each subcommand: a module that is not there is one line naming it, exit 2,
    before the command does anything."""
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    runnable: dict[str, list[str]] = {}
    for argv in _cases(tmp_path, model_folder).values():  # the first case of each command that parses
        try:
            if argv[0] not in runnable and not parser.parse_known_args(argv)[1]:
                runnable[argv[0]] = argv
        except SystemExit:
            pass
    capsys.readouterr()
    assert set(runnable) == commands, sorted(commands - set(runnable))
    failures = []
    for command, argv in sorted(runnable.items()):
        code, err = _run([*argv, "--plugin", "qkvplug_not_installed"], capsys)
        want = (f"qkv {command}: error: plugin module 'qkvplug_not_installed' could not be imported: "
                "ModuleNotFoundError: No module named 'qkvplug_not_installed'; install it or put it on PYTHONPATH")
        if code != 2 or err.strip().splitlines() != [want]:
            failures.append(f"{command}: exit {code}, stderr {err[-400:]!r}")
    assert not failures, "\n".join(failures)
    assert (tmp_path / "user" / "thesis.tex").read_text() == "mine"
