"""``qconsist history``: a model's nights, and when a hash or the verdict first changed (and what else did)."""

from __future__ import annotations

import textwrap

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console


def _to_the_second(when: str | None) -> str:
    """A recorded time (an entry's own start has milliseconds) to the second: 2026-01-31T02:00:00Z."""
    return f"{when[:19]}Z" if when and len(when) > 20 else str(when or "?")


def _seconds(seconds: float | None) -> str:
    """The entry's own wall seconds, in a column of 8; unknown (not measured: it never ran, an older history): —."""
    return f"{'—':>8}" if seconds is None else f"{seconds:>6.1f} s"


def _night_lines(row: dict, word: str, hashes: str, night: str, width: int) -> list[str]:
    """A night on one line, or where the terminal is narrower than that line (80 columns), the night, its start,
    verdict and seconds on one line and the md5s (and the night's status) under it, wrapped to the width."""
    head = f"  {row['night_id']}  {_to_the_second(row['started'])}  {word:<5} {_seconds(row['seconds'])}"
    line = f"{head}  {hashes}  {night}".rstrip()
    if len(line) <= width:
        return [line]
    rest = (f"{night} night; " if night else "") + f"md5 {hashes}"
    return [head, *("    " + part for part in textwrap.wrap(rest, max(width - 4, 20), break_long_words=False))]


def history(
    model: str = typer.Argument(..., help="Model name, as in the nightly file's [[models]] name."),
    history: opt.History = None,
    json_output: opt.Json = False,
) -> None:
    """Show MODEL's nights (when each entry started, its verdict, its own seconds, its hashes) and each change:
    which stage's hash or the verdict changed, first on which night, and what changed in the environment with it.

    Exit 0; 2: no such database or model.
    """
    from qconsist.errors import InputError
    from qconsist.history import History as HistoryDB, model_timeline
    from qconsist.store.runs import default_history

    database = default_history(given=history)
    if not database.is_file():
        raise InputError(f"history database {database} does not exist; run qconsist nightly first (or give `history`)")
    db = HistoryDB(database, read_only=True)
    timeline = model_timeline(db, model)
    if json_output:
        print_json(timeline)
        return
    console = stdout_console()
    console.print(f"{model}: {len(timeline.nights)} night(s) in {database}")
    console.print("  night, entry started (UTC), verdict, entry seconds, md5 of each stage")
    before: list[str] = []
    for row in timeline.nights:
        verdict = row["verdict"]
        word = "error" if verdict is None else ("pass" if verdict["passed"] else "FAIL")
        hashes = " ".join(f"{stage}={(h.get('md5') or '')[:8]}" for stage, h in row["hashes"].items())
        night = row["night_status"] if row["night_status"] != "complete" else ""
        for line in _night_lines(row, word, hashes, night, console.width):
            console.print(line)
        reasons = list(verdict["reasons"]) if verdict and verdict["reasons"] else []
        for reason in reasons:  # a reason the night before gave too is named, not said again
            console.print(f"      {reason.split(': ', 1)[0]}: as the night before" if reason in before else f"      {reason}")
        before = reasons
        if row["error"]:
            console.print(f"      error: {row['error']}")
    if not timeline.changes:
        console.print("no hash or verdict changed")
        return
    console.print("changes:")
    for change in timeline.changes:
        console.print(f"  {change.describe()}")
