"""``qconsist verify RUN…``: check every file of run directories against the sha256 their manifests recorded."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.errors import EXIT_OK, RunStoreError


def verify(
    runs: List[Path] = typer.Argument(..., help="Run directories to verify."),
    json_output: opt.Json = False,
) -> None:
    """List every file of each run with its status: ok, modified, missing, refused (a path or link leaving
    the run, a device, an oversized file) or unrecorded (added after the run).

    Exit 0 every run verified; 2 a run is incomplete, damaged or modified (the first problem on stderr).
    """
    from qconsist.store.runs import verify_run

    results = [verify_run(run) for run in runs]
    if json_output:
        print_json({"schema": "qconsist.verify/1", "runs": [r.to_json() for r in results],
                    "passed": all(r.passed for r in results)})
    else:
        console = stdout_console()
        for result in results:
            state = "verified" if result.passed else ("modified" if result.problems else result.state)
            console.print(f"run {result.run}: {state} ({len(result.files)} file(s), {result.bytes} bytes hashed in "
                          f"{result.seconds:.2f} s)")
            for entry in result.files:
                console.print(f"  {entry.status:<10} {entry.path}" + (f"  {entry.detail}" if entry.status not in ("ok",) and entry.detail else ""))
    failed = [r for r in results if not r.passed]
    if failed:
        raise RunStoreError(failed[0].summary() if failed[0].problems or failed[0].error else f"run {failed[0].run} is {failed[0].state}")
    raise typer.Exit(EXIT_OK)
