"""``qconsist report``: one self-contained HTML file for runs, nightly entries, nights and diffs."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import stdout_console


def report(
    items: List[Path] = typer.Argument(..., help="Run directories (pipeline, inference, locate, nightly entry, night) or `qconsist diff --json` files."),
    output: Path = typer.Option(..., "-o", "--output", help=opt.OUTPUT_HELP),
    force: opt.Force = False,
) -> None:
    """Write one self-contained HTML report: verdict, artifacts table, per-node divergence along the
    topological order (inline SVG), origin nodes, GPU configuration matrix with latencies; for a diff, its
    per-node divergence as Google Model Explorer node data beside it (OUTPUT's name + .explorer/), linked.

    Exit 0: written; 2: an input is not a complete run or a diff result, or OUTPUT cannot be written.
    """
    from qconsist.report import render_paths
    from qconsist.store.outputs import check_output, write_output

    check_output(output, items, force)
    explorer = output.parent / f"{output.stem}.explorer"
    write_output(output, render_paths(items, explorer, output.parent), items, force)
    stdout_console().print(f"report: {output}")
    if explorer.is_dir():
        stdout_console().print(f"Model Explorer node data: {explorer}/")
