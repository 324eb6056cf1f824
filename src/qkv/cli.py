"""Command line: ``qkv SUBCOMMAND …`` — parse, build a dataclass or arguments, call the library.

Every subcommand takes ``--plugin MODULE`` (:func:`add_common_options`): the module is imported
before the command runs, after the installed plugins (:mod:`qkv.plugins`).

Errors have one home: :func:`main`. A subcommand raises; ``main`` prints one line
``qkv <command>: error: <message>`` (the message names the problem and the fix) and exits 2 —
a Python traceback only with ``--debug`` (or ``QKV_DEBUG=1``). Ctrl-C prints one line and exits
130; outputs appear only when complete, so an interrupted command leaves nothing half-written.

Library modules are imported inside the command functions, not at the top: ``qkv COMMAND`` builds
only that command's parsers (:data:`qkv.cli._GROUPS`), so a command imports no other command's
library (measured by ``benchmarks/call_path.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading

from qkv._faults import fault_point

__all__ = ["main", "console", "exit_with", "build_parser", "command_of", "add_common_options"]


#: Every subcommand after ``demo``, in the order ``qkv --help`` lists them, with the function that
#: adds its parsers (``module:function``). A command line
#: naming one of them builds only that group's parsers, so ``qkv pretrain`` imports and runs no other
#: command's module; ``qkv --help``, no command or an unknown one builds them all.
_GROUPS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("convert",), "qkv.checkpoints.cli:add_convert_parser"),
    (("pretrain",), "qkv.training.cli:add_pretrain_parser"),
    (("finetune", "predict"), "qkv.finetune.cli:add_finetune_parsers"),
    (("analyze", "inspect", "findings"), "qkv.analysis.cli:add_analysis_parsers"),
    (("embed", "index", "search", "train-embeddings", "eval-embeddings"),
     "qkv.embeddings.cli:add_embedding_parsers"),
    (("ablate",), "qkv.experiments.cli:add_ablate_parser"),
    (("generate",), "qkv.generation.cli:add_generate_parser"),
    (("translate",), "qkv.translation.cli:add_translate_parser"),
    (("caption",), "qkv.vision.cli:add_caption_parser"),
    (("fill-mask",), "qkv.pipelines.cli:add_fill_mask_parser"),
    (("lab",), "qkv.lab.cli:add_lab_parser"),
    (("export",), "qkv.checkpoints.cli:add_export_parser"),
    (("serve",), "qkv.serve.cli:add_serve_parser"),
)
_ALL = frozenset(name for names, _ in _GROUPS for name in names) | {"demo"}


def _register(sub, home: str) -> None:
    import importlib

    module, function = home.split(":")
    getattr(importlib.import_module(module), function)(sub)


def command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top level has only flags)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``qkv`` parser: every subcommand, or with ``command`` (a known name) only the ones of its
    group (``demo`` is always there)."""
    parser = argparse.ArgumentParser(
        prog="qkv",
        description="qkv — transformer encoders built around self-attention.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="pretrain cpu-small on 20 Newsgroups for 8 minutes and show what it learned "
        "(or --attention: the core showcase)",
        description="Pretrain the cpu-small preset with masked-language modelling on the 20 Newsgroups "
        "training split for --minutes of wall-clock training (the learning rate decays to zero at the "
        "deadline, whatever the machine's speed), then show what it learned: held-out masked-token "
        "accuracy on the test split against the most-frequent-token baseline, fill-in-the-blank examples "
        "against the unigram baseline, which attention heads specialised, a heatmap PNG and an offline "
        "attention viewer. With --attention, instead run the showcase of the attention core: the "
        "textbook equations in NumPy against qkv's PyTorch attention, every similarity and path.",
    )
    demo.add_argument("--attention", action="store_true", help="run the attention-core showcase instead")
    demo.add_argument("--out", default="runs/demo", help="run folder (default runs/demo); a folder an "
                      "earlier qkv demo made is replaced, any other non-empty folder is refused")
    demo.add_argument("--minutes", type=float, default=8.0, help="training time in minutes (default 8; "
                      "data preparation, under a minute, and the final report come on top)")
    demo.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                      help="auto (default): bf16 mixed precision where the CPU has native bf16, else fp32")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    for names, home in _GROUPS:
        if command is None or command in names or command not in _ALL:
            _register(sub, home)
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks (also QKV_DEBUG=1)")
    for p in sub.choices.values():
        add_common_options(p)
    return parser


def add_common_options(p: argparse.ArgumentParser) -> None:
    """The options of every subcommand (added here, for all of them): ``--debug`` and ``--plugin``."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show Python tracebacks on errors (also QKV_DEBUG=1)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import this plugin module first (it registers similarities, backends, norms or "
                   "position schemes; see docs/plugins.md); repeatable. Installed plugins (entry point "
                   "group qkv.plugins) load without it")


def _load_plugins(modules: list[str]) -> None:
    """The installed plugins, then ``--plugin`` modules; shared with the processes the command starts."""
    from qkv import plugins

    plugins.load_plugins()
    plugins.import_plugins(modules)
    plugins.share_with_children(modules)


#: What a qkv run folder may hold; ``qkv demo`` replaces a folder only if it holds nothing else.
def _demo(args: argparse.Namespace) -> int:
    from qkv.demo import run_attention_demo
    from qkv.demo_pretrain import run_pretrain_demo

    if args.attention:
        run_attention_demo(seed=args.seed)
        return 0
    # bad --minutes or an --out the demo did not make: a DemoError (a QkvError) before anything runs
    figures = run_pretrain_demo(args.out, minutes=args.minutes, seed=args.seed, precision=args.precision)
    return 0 if figures.get("status", "complete") == "complete" else 130


#: terminal escape sequences (colours, cursor moves) and other control characters but newline and tab
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


def describe_error(exc: BaseException) -> str:
    """The one-line message the command line prints for ``exc`` (a plugin's or library's colour codes
    and control characters removed)."""
    return _CONTROL.sub("", _describe(exc))


def _describe(exc: BaseException) -> str:
    from qkv.errors import QkvError

    if isinstance(exc, QkvError):
        return str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc)
        hint = {28: " (free some space and run the command again)",
                13: " (choose a writable location)"}.get(exc.errno or 0, "")
        return f"{where}{what}{hint}"
    if isinstance(exc, (ValueError, TypeError)) and str(exc):
        return str(exc)
    if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "not enough memory" in str(exc):
        return (f"out of memory ({str(exc).split(' Error code')[0] or 'MemoryError'}); choose smaller sizes "
                "(--batch-size, --max-len, the model's) or free memory")
    return (f"{type(exc).__name__}: {exc} — an unexpected error; rerun with --debug for the traceback "
            "and report it")


def main(argv: list[str] | None = None) -> int:
    """Run ``qkv`` with ``argv``; return the exit status (0 ok, 2 error, 130 interrupted, 143 terminated).

    Everything runs inside the one handler — building the command's parser (which imports its library)
    too — so that Ctrl-C at any moment after start-up is one line and exit 130.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    name = f"qkv {command}" if command in _ALL else "qkv"
    debug = "--debug" in argv or os.environ.get("QKV_DEBUG", "") not in ("", "0")
    previous = _catch_sigterm()
    try:
        return _run(argv)
    except Terminated:
        if debug:
            raise
        print(f"\n{name}: terminated (SIGTERM); no output was left half-written (outputs appear only when "
              "complete)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{name}: interrupted; no output was left half-written (outputs appear only when "
              "complete)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the reader left (`| head`)
        return 0
    except Exception as exc:  # the one handler of every subcommand's errors
        if debug:
            raise
        print(f"{name}: error: {describe_error(exc)}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


#: whether a SIGINT reached :func:`note_interrupt` in this process (:func:`exit_with` reads it)
_INTERRUPTED = False


def note_interrupt(signum, frame) -> None:
    """The SIGINT handler of ``qkv`` and ``python -m qkv``: Python's own (a ``KeyboardInterrupt``), with a
    note that one arrived."""
    global _INTERRUPTED
    _INTERRUPTED = True
    raise KeyboardInterrupt


def console() -> None:
    """The ``qkv`` script: :func:`main` with the process's arguments, then :func:`exit_with` its status."""
    signal.signal(signal.SIGINT, note_interrupt)
    exit_with(main())


def exit_with(code: int) -> None:
    """End the process with ``code``.

    A Ctrl-C from here on is ignored (the command has finished). An interrupted command (130) has said
    so in one line and run its clean-up (its ``finally`` blocks). A Ctrl-C that lands inside code a
    library runs through ``PyRun_String`` (a compiled extension's own Python) leaves the interpreter's
    "unhandled KeyboardInterrupt" mark set although :func:`main` handled it, and the interpreter would
    end itself by SIGINT at exit (status −2, seen in embed's first seconds) instead of ``code``: so after
    any Ctrl-C, flush and leave with the status directly.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130 or _INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


class Terminated(BaseException):
    """SIGTERM arrived: raised where the program is, so that every ``finally`` and ``with`` block cleans up as
    for Ctrl-C (a command that handles SIGTERM itself — training, ``qkv serve`` — installs its own handler)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _catch_sigterm():
    """Install :func:`_raise_terminated` for SIGTERM where nothing else handles it; the handler it replaced
    (to restore), or ``None`` when it installed nothing (not the main thread, or a handler already set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, _raise_terminated)
    return previous


def _run(argv: list[str]) -> int:
    """Parse ``argv`` (the command's parsers only), load the plugins, run the command."""
    fault_point("cli.start")
    parser = build_parser(command_of(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser: "qkv <command>: error: unrecognized arguments"
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        (sub.choices[args.command] if getattr(args, "command", None) else parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    fault_point("cli.parsed")
    _load_plugins(getattr(args, "plugin", []))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    console()
