"""The ``qconsist`` command (and ``python -m qconsist``): the command line imported inside an interrupt guard.

Importing the command line (typer, rich, the commands) takes about 0.4 s; a Ctrl-C or SIGTERM in that time
would otherwise end in a ``KeyboardInterrupt`` traceback and exit -2. Here it is what it is anywhere else: one
line, ``error: interrupted``, exit 130 (docs/trust.md "Exit codes").
"""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # as qconsist.errors says; not imported, to keep this module's own import instant


class _Terminated(KeyboardInterrupt):
    pass


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated()


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _terminated)  # the command's own boundary takes over inside it
    try:
        from qconsist.cli import main as command

        signal.signal(signal.SIGTERM, previous)
        command()  # a Ctrl-C while typer builds the command, before the boundary, lands here too
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
