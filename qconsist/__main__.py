"""The ``qconsist`` command (and ``python -m qconsist``): SIGINT and SIGTERM taken before anything else is imported.

Importing the command line (typer, rich, the commands) and then numpy, onnx and onnxruntime takes up to a second;
a Ctrl-C or SIGTERM in that time, or anywhere after, is what it is anywhere else: one line, ``error: interrupted``,
exit 130 (docs/trust.md "Exit codes"; how, in ``qconsist.interrupt``).
"""

from __future__ import annotations

from qconsist import interrupt


def main() -> None:
    interrupt.install()  # first: before the command line, and the C++ extensions it loads, are imported
    try:
        from qconsist.cli import main as command

        command()  # typer ends it with SystemExit, whatever happened
        code: object = 0
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:  # before the command's own boundary, or after it
        code = interrupt.EXIT_INTERRUPTED
    raise SystemExit(interrupt.finish(code))


if __name__ == "__main__":
    main()
