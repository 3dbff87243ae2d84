"""``qconsist history``: a model's nights, and when a hash or the verdict first changed (and what else did)."""

from __future__ import annotations


import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console


def history(
    model: str = typer.Argument(..., help="Model name, as in the nightly file's [[models]] name."),
    history: opt.History = None,
    json_output: opt.Json = False,
) -> None:
    """Show MODEL's nights (hashes, verdicts) and each change: which stage's hash or the verdict changed,
    first on which night, and what changed in the environment with it.

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
    before: list[str] = []
    for row in timeline.nights:
        verdict = row["verdict"]
        word = "error" if verdict is None else ("pass" if verdict["passed"] else "FAIL")
        hashes = " ".join(f"{stage}={(h.get('md5') or '')[:8]}" for stage, h in row["hashes"].items())
        night = row["night_status"] if row["night_status"] != "complete" else ""
        console.print(f"  {row['night_id']}  {row['started']}  {word:<5} {hashes}  {night}".rstrip())
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
