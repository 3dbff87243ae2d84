"""The CLI's progress bars show the throughput beside the count and the time left."""

from __future__ import annotations

import importlib
import io
import re
import time

from rich.console import Console


def test_progress_shows_items_per_second(monkeypatch):
    cli_app = importlib.import_module("qconsist.cli.app")  # the module (qconsist.cli.app is also the typer app)
    stream = io.StringIO()
    monkeypatch.setattr(cli_app, "stderr_console", lambda: Console(file=stream, force_terminal=True, width=120))
    progress = cli_app.RichProgress()
    with progress.task("inference", 400) as handle:
        for _ in range(40):
            handle.advance(5)
            time.sleep(0.005)
        progress._progress.refresh()
        shown = stream.getvalue()
    assert re.search(r"inference .* 200/400 .*\b\d[\d,]*/s\b", shown), shown[-300:]
