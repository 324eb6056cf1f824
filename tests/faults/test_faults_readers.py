"""Every subcommand reads a user's data file the same way (the "silently wrong" class): a ``.csv`` with a
header, a ``.tsv``, a ``.jsonl`` and a plain ``.txt`` are each either read by the one reader
(:mod:`qkv.data.readers` — the header a header, never a document; the id column its own column, never
glued to the text) or refused with one line. The walker enumerates the subcommands from the command line's
registry and fails for a subcommand with no row, or a subcommand/kind pair with no recorded behaviour. To
add a command, add its row to :func:`_cases` (or to :data:`NO_DATA_FILE`).

The reader is watched, not the command's whole run: the one reader's three parsers (CSV/TSV rows, JSON
lines, plain lines) are wrapped to note what they yielded, and the command is stopped as soon as one of
them has read the file to its end — so a case costs a model load, not a training run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import build_parser, main
from qkv.data import readers

KINDS = ("csv", "tsv", "jsonl", "txt")
ROWS = (("d1", "first document about cats", "a"), ("d2", "second document about dogs", "b"),
        ("d3", "third document about birds", "a"))

#: Subcommands that take no user data file — and what they read instead.
NO_DATA_FILE = {
    "demo": "built-in datasets only",
    "convert": "model folders only",
    "export": "a model folder only",
    "serve": "a model folder (and an index folder made by qkv index)",
    "search": "an index folder and a query given as text",
    "generate": "prompts given as text",
    "fill-mask": "texts given as arguments",
    "inspect": "one text given as an argument (or one picture)",
    "lab": "synthetic tasks generated in the package",
    "ablate": "its workers run qkv pretrain on --corpus: the pretrain row keeps the reading",
    "eval-embeddings": "named labelled datasets; a file goes through iter_records (tests/embeddings)",
}

READ = "read"  # the pair's behaviour: the one reader parsed the file by its kind


class _Read(BaseException):
    """Raised when a watched parser has read a file to its end: the command is stopped there."""


def _files(tmp: Path) -> dict[str, Path]:
    out = {}
    for kind, sep in (("csv", ","), ("tsv", "\t")):
        out[kind] = tmp / f"docs.{kind}"
        out[kind].write_text("".join(sep.join(r) + "\n" for r in (("id", "text", "label"), *ROWS)))
    out["jsonl"] = tmp / "docs.jsonl"
    out["jsonl"].write_text("".join(json.dumps({"id": i, "text": t, "label": y}) + "\n" for i, t, y in ROWS))
    out["txt"] = tmp / "docs.txt"
    out["txt"].write_text("".join(t + "\n" for _, t, _ in ROWS))
    return out


def _refused(fragment: str) -> str:
    return "refused: " + fragment


def _cases(tmp: Path, model: Path, clf: Path, vit: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """``command: (argv with FILE in place of the data file, behaviour per kind)``."""
    all_read = dict.fromkeys(KINDS, READ)
    records = {"csv": READ, "tsv": READ, "jsonl": READ, "txt": _refused("unknown format")}
    return {
        "embed": (["embed", str(model), "FILE", "--out", str(tmp / "e.npy")], all_read),
        "index": (["index", str(model), "FILE", "--out", str(tmp / "ix")], all_read),
        "predict": (["predict", str(clf), "FILE", "--out", str(tmp / "p.jsonl")], all_read),
        "finetune": (["finetune", str(model), "--task", "sequence-classification", "--train", "FILE", "--out",
                      str(tmp / "f"), "--steps", "1", "--no-progress"], records),
        "pretrain": (["pretrain", "--corpus", "FILE", "--out", str(tmp / "r"), "--preset", "tiny", "--vocab-size",
                      "120", "--max-len", "16", "--steps", "1", "--no-progress"], all_read),
        "train-embeddings": (["train-embeddings", str(model), "--corpus", "FILE", "--out", str(tmp / "t"),
                              "--steps", "1", "--no-progress"], all_read),
        "analyze": (["analyze", str(model), "--corpus", "FILE", "--out", str(tmp / "a"), "--quiet"], all_read),
        "findings": (["findings", "kobayashi", str(model), "--data", "FILE", "--out", str(tmp / "k")], all_read),
        # the input is read before the model is asked whether it translates
        "translate": (["translate", str(model), "--input", "FILE", "--output", str(tmp / "t.txt")], all_read),
        "caption": (["caption", str(vit), "FILE"], dict.fromkeys(KINDS, _refused("not a caption model"))),
    }


class _Spy:
    """Notes what the one reader's parsers yield, per file; stops the command at a file's end."""

    def __init__(self, monkeypatch, watched: Path):
        self.watched, self.seen, self.depth = watched, [], 0
        csv_rows, json_lines, raw_lines = readers.csv_rows, readers.json_lines, readers.raw_lines
        monkeypatch.setattr(readers, "csv_rows", lambda fh, path, fmt, **kw: self._wrap(
            csv_rows(fh, path, fmt, **kw), path, fmt))
        monkeypatch.setattr(readers, "json_lines", lambda fh, path, *a, **kw: self._wrap(
            json_lines(fh, path, *a, **kw), path, "jsonl"))
        monkeypatch.setattr(readers, "raw_lines", lambda fh, path, *a, **kw: self._wrap(
            raw_lines(fh, path, *a, **kw), path, "text"))

    def _wrap(self, items, path, kind):
        mine = Path(path).resolve() == self.watched.resolve()
        self.depth += 1
        outer, got = self.depth == 1, []
        try:
            for item in items:
                got.append(item)
                yield item
        finally:
            self.depth -= 1
        if mine and outer:  # reached only when the file was read to its end
            self.seen.append((kind, got))
            raise _Read


def _values(kind: str, got: list) -> list[dict] | list[str]:
    if kind in ("csv", "tsv", "jsonl"):
        return [{k: str(v) for k, v in item[1].items()} for item in got]
    return [item[-1].decode() for item in got]


def _check_read(file_kind: str, seen: list) -> str | None:
    """Why what the reader yielded is not the file read by its kind (None: it is)."""
    if not seen:
        return "the one reader never read the file to its end"
    kind, got = seen[0]
    want_kind = {"txt": "text"}.get(file_kind, file_kind)
    if kind != want_kind:
        return f"read as {kind}, not as {want_kind}"
    values = _values(kind, got)
    if kind == "text":
        want = [t for _, t, _ in ROWS]
    else:
        want = [{"id": i, "text": t, "label": y} for i, t, y in ROWS]
    return None if values == want else f"read {values!r}"


@pytest.fixture()
def folders(tmp_path, model_folder):
    import torch

    from qkv.checkpoints.io import load, save
    from qkv.config import ModelConfig
    from qkv.models.heads import TaskConfig
    from qkv.models.task_builders import build_task_model
    from qkv.models.vision_builders import build_image_classifier
    from qkv.vision.config import model_config

    torch.manual_seed(0)
    tok = load(model_folder).tokenizer
    clf, vit = tmp_path / "clf", tmp_path / "vit"
    cfg = ModelConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_len=32)
    save(build_task_model(cfg, TaskConfig("sequence-classification", ("a", "b"))), clf, tokenizer=tok)
    save(build_image_classifier(model_config("vit-digits", {"image": {"patch": 2}}, n_layers=1),
                                TaskConfig("sequence-classification", ("a", "b"))), vit)
    return clf, vit


def test_every_subcommand_has_a_reader_row_for_every_kind(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    cases = _cases(tmp_path, model_folder, tmp_path, tmp_path)
    assert commands <= set(cases) | set(NO_DATA_FILE), sorted(commands - set(cases) - set(NO_DATA_FILE))
    assert not set(cases) & set(NO_DATA_FILE)
    missing = [f"{c} {k}" for c, (_, kinds) in cases.items() for k in KINDS if k not in kinds]
    assert not missing, f"no recorded behaviour for: {missing}"


def test_every_command_reads_each_kind_with_the_one_reader_or_refuses_it(tmp_path, model_folder, folders, capsys):
    clf, vit = folders
    files = _files(tmp_path)
    failures = []
    for command, (argv, kinds) in _cases(tmp_path, model_folder, clf, vit).items():
        for kind, want in kinds.items():
            args = [str(files[kind]) if a == "FILE" else a for a in argv]
            with pytest.MonkeyPatch.context() as mp:
                spy = _Spy(mp, files[kind])
                try:
                    code = main(args)
                except _Read:
                    code = "read"
                except SystemExit as e:
                    code = e.code
            err = capsys.readouterr().err
            lines = [x for x in err.splitlines() if x.startswith(f"qkv {command}: error:")]
            if want == READ:
                why = _check_read(kind, spy.seen)
                if why:
                    failures.append(f"{command} {kind}: {why}; exit {code}, stderr {err[-300:]!r}")
            elif code != 2 or len(lines) != 1 or want.removeprefix("refused: ") not in lines[0]:
                failures.append(f"{command} {kind}: expected one line with {want!r}; exit {code}, "
                                f"stderr {err[-300:]!r}")
    assert not failures, "\n".join(failures)
