"""An entry's history row holds the times the entry ran (schema version 4): its task's own start, measured where it
ran, and that start plus its own seconds; the hand-out time is ``handed_out``. An entry that never ran and one its
night's interruption cut keep the head's times. ``qconsist history MODEL`` (table and ``--json``) and the history
page show each night's seconds; the night's summary and page show them beside the verdict. Real nights of the small
conv net (``nightly_files.convnet_entries``)."""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from contextlib import contextmanager
from typing import Iterator

import pytest
from rich.console import Console
from typer.testing import CliRunner

import qconsist.cli.history

from nightly_files import convnet_entries
from qconsist.cli import app
from qconsist.nightly import load_nightly, run_nightly

NAMES = ["alpha", "beta"]


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _rows(path) -> dict[tuple[str, str], dict]:
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return {(r["night_id"], r["model"]): dict(r) for r in conn.execute("SELECT * FROM entries")}


def test_each_row_holds_the_entrys_own_start_and_seconds(tmp_path, monkeypatch):
    path = convnet_entries(tmp_path, NAMES)
    database = tmp_path / "runs" / "history.sqlite"
    nights = [run_nightly(load_nightly(path)) for _ in range(3)]
    rows = _rows(database)
    for night in nights:
        assert night.passed
        for entry in night.entries:
            row = rows[(night.night_id, entry.model)]
            assert row["started"] == entry.started  # the task's own start, to the millisecond
            assert row["seconds"] == entry.seconds > 0
            assert _when(row["finished"]) - _when(row["started"]) == pytest.approx(dt.timedelta(seconds=entry.seconds),
                                                                                   abs=dt.timedelta(milliseconds=1))
            # handed out (to the second) before it started; recorded after it finished
            assert _when(row["handed_out"]) <= _when(row["started"]) < _when(row["finished"])
            assert len(row["handed_out"]) == 20 and len(row["started"]) == len(row["finished"]) == 24
        # one after another: alpha ended before beta started
        first, second = (rows[(night.night_id, name)] for name in NAMES)
        assert _when(first["finished"]) <= _when(second["started"]) + dt.timedelta(milliseconds=1)
    # `qconsist history`: each night's started (to the second) and seconds, in the table and in --json
    result = CliRunner().invoke(app, ["history", "alpha", "--history", str(database)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"alpha: 3 night(s) in {database}", "  night, entry started (UTC), verdict, entry seconds, md5 of each stage"]
    for night, line in zip(nights, lines[2:5], strict=True):
        entry = night.entries[0]
        assert line.startswith(f"  {night.night_id}  {entry.started[:19]}Z  pass  {entry.seconds:>6.1f} s  convert=")
    # on a terminal of 200 columns each night is one line; of 80, the md5s go under the night, every line within 80
    for columns in (200, 80):
        monkeypatch.setattr(qconsist.cli.history, "stdout_console", lambda: Console(
            width=columns, highlight=False, soft_wrap=True, markup=False, force_terminal=False))
        shown = CliRunner().invoke(app, ["history", "alpha", "--history", str(database)]).stdout.splitlines()
        hashes = lines[2].split(" s  ", 1)[1]
        if columns == 200:
            assert shown == lines and max(len(line) for line in shown[1:]) <= 200
        else:
            assert max(len(line) for line in shown[1:]) <= 80  # the first line names the database's path
            assert shown[2:4] == [lines[2].split(" s  ", 1)[0] + " s", f"    md5 {hashes}"]
    data = json.loads(CliRunner().invoke(app, ["history", "alpha", "--history", str(database), "--json"]).stdout)
    assert [(n["started"], n["seconds"], n["finished"]) for n in data["nights"]] == [
        (rows[(night.night_id, "alpha")]["started"], night.entries[0].seconds, rows[(night.night_id, "alpha")]["finished"])
        for night in nights]
    assert all(n["handed_out"] == rows[(n["night_id"], "alpha")]["handed_out"] for n in data["nights"])
    # the history page the nightly writes: a seconds column per night and the seconds over the nights
    page = (tmp_path / "runs" / "history.html").read_text()
    assert page.count("<th title=\"Entry duration: the task&#x27;s own wall seconds, measured where it ran\">seconds</th>") == 2
    for name in NAMES:  # the first night (no baseline) on a row; the next two repeat each other: one row, low–high
        shown = [f"{night.entries[NAMES.index(name)].seconds:.1f}" for night in nights]
        table = re.search(rf"<h3>Nights of <code>{name}</code>.*?</table>", page).group(0)
        cells = re.findall(r'<td class="status-pass">pass</td><td><code>[0-9a-f]+</code></td>(<td[^>]*>[^<]*</td>)', table)
        low, high = sorted(shown[1:], key=float)
        folded = low if low == high else f"{low}–{high}"
        assert cells == [f'<td title="each night, oldest first: {", ".join(shown[1:])}">{folded}</td>', f"<td>{shown[0]}</td>"]
    assert "(entry.seconds)</span></figcaption>" in page
    # the night's terminal summary and page: each entry's seconds beside its verdict
    report = (nights[-1].path / "report.html").read_text()
    for entry in nights[-1].entries:
        assert f"<td>{entry.seconds:.1f}</td></tr>" in report


def test_an_entry_that_never_ran_keeps_the_heads_times(tmp_path):
    """An entry asking for a GPU type this machine lacks never runs: no start of its own, no seconds; its row keeps
    the hand-out time as started, and `history` shows its seconds as unknown."""
    path = convnet_entries(tmp_path, ["alpha"])
    path.write_text(path.read_text().replace("cpus = 1\n", 'cpus = 1\ngpus = ["H100"]\n'))
    database = tmp_path / "runs" / "history.sqlite"
    night = run_nightly(load_nightly(path))
    [entry] = night.entries
    assert (entry.model, entry.status, entry.started, entry.seconds) == ("alpha@H100", "error", None, 0.0)
    row = _rows(database)[(night.night_id, "alpha@H100")]
    assert row["seconds"] is None and row["started"] == row["handed_out"] and len(row["started"]) == 20
    assert _when(row["started"]) <= _when(row["finished"])  # when its outcome was recorded
    result = CliRunner().invoke(app, ["history", "alpha@H100", "--history", str(database)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2] == f"  {night.night_id}  {row['started']}  error        —  "[:-2]
    assert "<th title=\"Entry duration" not in (tmp_path / "runs" / "history.html").read_text()  # nothing measured


class _StopAtSecondEntry:
    """Progress that presses Ctrl-C when the second entry's pipeline starts (its row is then ``running``)."""

    def __init__(self) -> None:
        self.first: str | None = None  # the pipeline's first stage, as its progress names it

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        if description.startswith("stage "):
            if self.first is None:
                self.first = description
            elif description == self.first:
                raise KeyboardInterrupt
        yield self

    def advance(self, amount: int = 1) -> None:
        return None


def test_an_interrupted_entry_keeps_its_hand_out_time(tmp_path):
    path = convnet_entries(tmp_path, NAMES)
    database = tmp_path / "runs" / "history.sqlite"
    with pytest.raises(KeyboardInterrupt):
        run_nightly(load_nightly(path), progress=_StopAtSecondEntry())
    rows = {model: row for (_, model), row in _rows(database).items()}
    alpha, beta = rows["alpha"], rows["beta"]
    assert (alpha["status"], beta["status"], beta["error"]) == ("done", "error", "night interrupted")
    assert alpha["seconds"] > 0 and alpha["started"] != alpha["handed_out"] and len(alpha["started"]) == 24
    assert beta["seconds"] is None and beta["started"] == beta["handed_out"]  # it never reported a start of its own
    # marked when the night was interrupted (the head's times are to the second, the entry's own to the millisecond)
    assert _when(alpha["finished"]) < _when(beta["finished"]) + dt.timedelta(seconds=1)
