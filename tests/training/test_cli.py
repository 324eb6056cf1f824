"""The option tables of qkv pretrain, finetune and ablate: every --help line names a real default once."""

from __future__ import annotations

import re

import pytest

from qkv.cli import build_parser


@pytest.mark.parametrize("command", ["pretrain", "finetune", "ablate"])
def test_help_shows_each_default_once_and_no_placeholder(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    for action in sub._actions:
        text = action.help or ""
        assert "MISSING" not in text, (command, action.option_strings, text)
        assert len(re.findall(r"\(default", text)) <= 1, (command, action.option_strings, text)
    task = next((a for a in sub._actions if "--task" in a.option_strings), None)
    if task is not None:  # a required field: no default to show
        assert "default" not in task.help
