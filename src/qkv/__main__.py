"""``python -m qkv``: the command line (:func:`qkv.cli.main`).

Ctrl-C while the command line itself is being imported is already one line and exit 130; from then
on :func:`qkv.cli.main`'s one handler says it.
"""

import signal
import sys


def _interrupted(signum, frame):
    sys.stderr.write("\nqkv: interrupted; nothing was written\n")
    raise SystemExit(130)


signal.signal(signal.SIGINT, _interrupted)
from qkv.cli import exit_with, main, note_interrupt  # noqa: E402  (after the handler: an early Ctrl-C is one line too)

signal.signal(signal.SIGINT, note_interrupt)
exit_with(main())
