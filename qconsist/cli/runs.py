"""``qconsist runs list|show|rm``: what a runs directory holds, and removing runs safely."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console

runs_app = typer.Typer(help="The run directories of a runs directory: list, show, remove.", no_args_is_help=True)


def _size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)  # pragma: no cover


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{seconds:.0f}s"


@opt.uses(runs_dir=opt.RUNS)
def list_command(
    *,
    runs_dir: Path,
    history: opt.History = None,
    json_output: opt.Json = False,
) -> None:
    """List the runs of a runs directory: kind, model, status (complete, incomplete, modified, invalid), verdict
    (PASS, FAIL and why, or — for a run that judges nothing), age, size, and whether the history names it as a
    baseline. Every complete run's files are verified."""
    from qconsist.history.db import baseline_runs
    from qconsist.store.runs import default_history, list_runs_dir

    listing = list_runs_dir(runs_dir, baseline_runs(default_history(runs_dir, history)))
    if json_output:
        print_json(listing)
        return
    _print_listing(listing.runs, runs_dir)


def _print_listing(runs: list, runs_dir: Path) -> None:  # runs: RunInfo
    """A header, one aligned line per run, newest first, then the count, the total size and how to free it."""
    console = stdout_console()
    ordered = sorted(runs, key=lambda run: run.age_seconds)
    header = ("run", "kind", "model", "status", "verdict", "age", "size")
    rows = [(run.name, run.kind, run.model, run.status + (" baseline" if run.baseline else ""), run.verdict,
             _age(run.age_seconds), _size(run.size), f"({run.detail})" if run.detail and run.status != "complete" else "")
            for run in ordered]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))] if rows else []
    last = len(header) - 1  # the size, right-aligned
    if rows:
        console.print("  ".join(f"{text:<{w}}" if i < last else f"{text:>{w}}" for i, (text, w) in enumerate(zip(header, widths))).rstrip())
    for row in rows:
        line = "  ".join(f"{text:<{w}}" if i < last else f"{text:>{w}}" for i, (text, w) in enumerate(zip(row, widths)))
        console.print((line + (f"  {row[-1]}" if row[-1] else "")).rstrip())
    total = sum(run.size for run in runs)
    console.print(f"{len(runs)} run(s) in {runs_dir}, {_size(total)}"
                  + ("; free space with qconsist runs rm --older-than 30d (--dry-run first)" if runs else ""))


@opt.uses(runs_dir=opt.RUNS)
def show(
    run: Path = typer.Argument(..., help="A run directory, or its name inside --runs-dir (as `runs list` prints it)."),
    *,
    runs_dir: Path,
    json_output: opt.Json = False,
) -> None:
    """One run: kind, model, status, age, size, and every file with its verification status."""
    from qconsist.store.runs import describe_run, find_run

    info, checked = describe_run(find_run(run, runs_dir))
    if json_output:
        print_json({"schema": "qconsist.runs/1", "run": info.to_json(), "verify": checked.to_json() if checked is not None else None})
        return
    console = stdout_console()
    verdict = "" if info.verdict == "—" else f", verdict {info.verdict}"
    console.print(f"run {info.path}: {info.kind} run of {info.model}, {info.status}{verdict}, started {info.started or '?'} "
                  f"({_age(info.age_seconds)} ago), {_size(info.size)}")
    if info.detail:
        console.print(f"  {info.detail}")
    for entry in checked.files if checked is not None else []:
        console.print(f"  {entry.status:<10} {entry.path}")


@opt.uses(runs_dir=opt.RUNS)
def rm(
    names: List[str] = typer.Argument(None, help="Run directory names inside --runs-dir (or use --incomplete / --older-than)."),
    *,
    incomplete: bool = typer.Option(False, "--incomplete", help="Remove every incomplete run (interrupted or killed; never one still being written)."),
    older_than: Optional[str] = typer.Option(None, "--older-than", help="Remove runs older than this age: 30d, 12h, 2w…"),
    force: opt.told(opt.Force, "Do what is refused by default: remove a run the history names as a baseline.", panel=None) = False,
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
    runs_dir: Path,
    history: opt.History = None,
    json_output: opt.Json = False,
) -> None:
    """Remove runs safely: only run directories inside --runs-dir, never one being written, never a baseline
    the history names unless --force."""
    from qconsist.history.db import baseline_runs
    from qconsist.store.runs import default_history, parse_age, remove_runs

    result = remove_runs(runs_dir, list(names or []), incomplete, parse_age(older_than) if older_than else None,
                         baseline_runs(default_history(runs_dir, history)), force, dry_run)
    if json_output:
        print_json(result)
        return
    console = stdout_console()
    verb = "would remove" if dry_run else "removed"
    for name in result.removed:
        console.print(f"{verb} {name}")
    for name, why in result.kept.items():
        console.print(f"kept {name}: {why}")
    console.print(f"{verb} {len(result.removed)} run(s), {_size(result.freed)}")
