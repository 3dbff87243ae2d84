"""``qconsist nightly``: every model of a nightly file through pipeline, dumps, locate, diff and gate."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console


def render_night(result) -> None:  # NightlyResult
    console = stdout_console()
    counts = result.summary()
    console.print(f"night {result.night_id}: {counts['pass']} pass, {counts['fail']} fail, {counts['error']} error")
    for entry in result.entries:
        console.print(f"  {entry.status.upper():<5} {entry.model}  ({entry.seconds:.1f} s)  {entry.entry_run or ''}")
        if entry.error:
            console.print(f"        error: {entry.error}")
        if entry.verdict is not None:
            for reason in entry.verdict.reasons:
                console.print(f"        {reason}")
        if entry.locate_skipped:
            console.print(f"        locate skipped: {entry.locate_skipped}")
    console.print(f"report: {result.path / 'report.html'}")
    console.print(f"history: {result.history}")


def nightly(
    file: Path = typer.Argument(..., parser=opt.read_path, help="Nightly file (TOML), e.g. pipelines/nightly.toml."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only this model (repeatable)."),
    runs_dir: opt.RunsDir = None,
    history: opt.History = None,
    json_output: opt.Json = False,
) -> None:
    """Run every model of FILE: pipeline, inference dumps, locate (where a GPU exists), the diff against the
    last good night and the gate; record everything in the history; write one HTML report.

    Exit 0: every gate passed; 1: a gate failed; 2: a model could not be judged or FILE is invalid.
    """
    from dataclasses import replace

    from qconsist.nightly import load_nightly, run_nightly

    config = load_nightly(file)
    if runs_dir is not None:
        config = replace(config, runs_dir=runs_dir.resolve(), history=(history or runs_dir / "history.sqlite").resolve())
    elif history is not None:
        config = replace(config, history=history.resolve())
    result = run_nightly(config, progress=progress_for(json_output), only=tuple(only or ()))
    if json_output:
        print_json(result)
    else:
        render_night(result)
    raise typer.Exit(result.exit_code)
