"""The ``qconsist`` command line: a thin typer layer over the library.

Each command lives in its own module (``qconsist/cli/<command>.py``), parses options, calls one library
function, renders the result, and maps ``QconsistError`` to one line on stderr and its exit code.
"""

from __future__ import annotations

from qconsist.cli.app import app

# Command modules register themselves on ``app`` when imported.
from qconsist.cli import models as _models  # noqa: F401,E402
from qconsist.cli import run as _run, diff as _diff  # noqa: F401,E402
from qconsist.cli import pipeline as _pipeline  # noqa: F401,E402
from qconsist.cli import calib as _calib  # noqa: F401,E402
from qconsist.cli import locate as _locate  # noqa: F401,E402
from qconsist.cli import gate as _gate, history as _history, nightly as _nightly, report as _report  # noqa: F401,E402

__all__ = ["app", "main"]


def main() -> None:
    app()
