"""The top-level command line: lazy registration of subcommands (qkv.cli)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from qkv import cli


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_full_parser_holds_every_group_in_help_order():
    names = list(_choices(cli.build_parser()))
    expected = ["demo"] + [n for group, _ in cli._GROUPS for n in group]
    assert names == expected  # a command added to a module but not to _GROUPS fails here


@pytest.mark.parametrize("group", [g for g, _ in cli._GROUPS], ids=lambda g: g[0])
def test_naming_a_command_builds_only_its_group_with_the_same_options(group):
    full = _choices(cli.build_parser())
    for name in group:
        one = _choices(cli.build_parser(name))
        assert set(one) == {"demo", *group}
        assert one[name].format_help() == full[name].format_help()


@pytest.mark.parametrize("argv,expected", [
    (["pretrain", "--corpus", "x"], "pretrain"),
    (["--debug", "embed", "m"], "embed"),
    (["--help"], None),
    ([], None),
])
def test_command_of(argv, expected):
    assert cli.command_of(argv) == expected


def test_an_unknown_command_is_refused_with_every_choice_listed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["pretrian"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'pretrian'" in err and "pretrain" in err and "export" in err


def test_pretrain_imports_no_other_commands_module():
    code = ("import sys, contextlib, io\n"
            "from qkv.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['pretrain', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('qkv.') and m.endswith('.cli')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['qkv.cli', 'qkv.training.cli']"
