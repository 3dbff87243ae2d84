"""The ``qconsist`` command line: a thin typer layer over the library.

Each command lives in its own module (``qconsist/cli/<command>.py``), parses options, calls one library
function, renders the result, and maps ``QconsistError`` to one line on stderr and its exit code.
"""

from __future__ import annotations

from qconsist.cli.app import app

# Command modules register themselves on ``app`` when imported.
from qconsist.cli import models as _models  # noqa: F401,E402

__all__ = ["app", "main"]


def main() -> None:
    app()
