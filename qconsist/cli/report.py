"""``qconsist report``: one self-contained HTML file for runs, nightly entries, nights and diffs, or the history page."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import stdout_console


def report(
    items: Optional[List[Path]] = typer.Argument(None, help="Run directories (pipeline, inference, locate, nightly entry, night) or `qconsist diff --json` files."),
    output: opt.told(opt.Output, "The file to write: the HTML page.") = ...,
    history: opt.told(opt.History, "History database: write the history page from it (give no ITEMS then).") = None,
    models: Optional[List[str]] = typer.Option(None, "--model", help="With --history: only this model, or one GPU type of it as NAME@TYPE (repeatable)."),
    gpus: Optional[List[str]] = typer.Option(None, "--gpu", help="With --history: only the nights on this GPU type, as the page names it: H100, 'none (CPU)' (repeatable)."),
    nights: Optional[int] = typer.Option(None, "--nights", help="With --history: only the last N nights (default: all)."),
    force: opt.Force = False,
) -> None:
    """Write one self-contained HTML report: verdict, artifacts table, per-node divergence along the
    topological order (inline SVG), origin nodes, GPU configuration matrix with latencies; for a diff, its
    per-node divergence as Google Model Explorer node data beside it (OUTPUT's name + .explorer/), linked.
    With --history (and no ITEMS): the history page, every model's nights at a glance (status, quantized md5
    changes, figures, first diverging node, a plot per figure) with filters by model and GPU type.

    Exit 0: written; 2: an input is not a complete run, a diff result or a qconsist history (or the history holds
    no such model, GPU type or night), or OUTPUT cannot be written.
    """
    from qconsist.errors import InputError
    from qconsist.store.outputs import check_output, write_output

    if history is not None:
        if items:
            raise InputError("give run directories and diff files, or `history`, not both")
        from qconsist.history import History, summarize_history
        from qconsist.report import render_history

        check_output(output, [history], force)
        if not history.is_file():
            raise InputError(f"history database {history} does not exist; run qconsist nightly first")
        summary = summarize_history(History(history, read_only=True), models or (), gpus or (), nights)
        write_output(output, render_history(summary, output.parent), [history], force)
        stdout_console().print(f"history page: {output} ({len(summary.series)} timeline(s), {len(summary.nights)} night(s))")
        return
    if models or gpus or nights is not None:
        raise InputError("`models`, `gpus` and `nights` choose what the history page shows; give `history` with them")
    if not items:
        raise InputError("give run directories or diff JSON files to report on, or `history` for the history page")
    from qconsist.report import render_paths

    check_output(output, items, force)
    explorer = output.parent / f"{output.stem}.explorer"
    write_output(output, render_paths(items, explorer, output.parent), items, force)
    stdout_console().print(f"report: {output}")
    if explorer.is_dir():
        stdout_console().print(f"Model Explorer node data: {explorer}/")
