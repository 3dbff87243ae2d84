"""Schema versions 3 and 4: each entry's own wall seconds, and its own start and finish (``handed_out``: when the head
handed it out). A history of schema version 2 (tests/data/history_v2.sql, written by the qconsist before these columns
from two real nights) is read as it is by a reader and migrated in place by a writer, every row kept as it was; the next
night hands out its entries with no known duration first, in the file's order, and records its own times beside the
older rows."""

from __future__ import annotations

import multiprocessing
import sqlite3
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from typer.testing import CliRunner

from nightly_files import convnet_nightly
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.history import History, summarize_history
from qconsist.history.db import SCHEMA_VERSION, TABLES_BY_VERSION
from qconsist.nightly import Order, load_nightly, night_tasks, run_nightly
from qconsist.nightly.order import hand_out

MODELS = ["convnet", "convnet-percentile"]


def _rows(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table, the columns version 2 had (in their order), sorted."""
    new = ("seconds", "handed_out")
    with sqlite3.connect(path) as conn:
        tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        rows = {}
        for table in tables:
            columns = [c[1] for c in conn.execute(f"PRAGMA table_info({table})") if c[1] not in new]
            rows[table] = sorted(conn.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall(), key=repr)
        return rows


def _columns(path: Path, table: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [c[1] for c in conn.execute(f"PRAGMA table_info({table})")]


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


def test_the_fixture_is_a_version_2_history_of_two_real_nights(v2_history):
    assert _version(v2_history) == 2 and "seconds" not in _columns(v2_history, "entries")
    rows = _rows(v2_history)
    assert {table: len(r) for table, r in rows.items()} == {
        "entries": 4, "environments": 1, "figures": 26, "hashes": 12, "nights": 2, "runs": 16, "verdicts": 4}
    with sqlite3.connect(v2_history) as conn:
        assert sorted(conn.execute("SELECT model, passed FROM verdicts").fetchall()) == [
            ("convnet", 0), ("convnet", 1), ("convnet-percentile", 0), ("convnet-percentile", 1)]


def test_a_reader_reads_version_2_as_it_is(v2_history):
    before = v2_history.read_bytes()
    db = History(v2_history, read_only=True)
    assert db.version == 2
    for model in MODELS:
        rows = db.model_rows(model)
        assert [row["seconds"] for row in rows] == [None, None]  # not measured then: unknown, never 0
        assert [row["handed_out"] for row in rows] == [None, None]  # started: the hand-out, as version 2 wrote it
        assert db.last_seconds(model) is None
    assert [s.key for s in summarize_history(db).series] == MODELS
    assert v2_history.read_bytes() == before


def test_a_writer_migrates_version_2_keeping_every_row(v2_history):
    before = _rows(v2_history)
    as_read = {model: History(v2_history, read_only=True).model_rows(model) for model in MODELS}
    db = History(v2_history)  # a writer (the next nightly) migrates it
    assert db.version == SCHEMA_VERSION == 4
    assert _version(v2_history) == 4 and set(TABLES_BY_VERSION[4]) == set(before)
    assert _columns(v2_history, "entries")[-2:] == ["seconds", "handed_out"]
    assert _rows(v2_history) == before  # every row of every table, every value
    with sqlite3.connect(v2_history) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(seconds), COUNT(handed_out) FROM entries").fetchone() == (4, 0, 0)
    for model in MODELS:
        assert History(v2_history, read_only=True).model_rows(model) == as_read[model]
    # the migrated history goes on: a new night records its entries' seconds, the next night reads them
    db.start_night("n3", "nightly.toml", {}, started="2026-02-01T02:00:00Z")
    db.start_entry("n3", "convnet", started="2026-02-01T02:00:00Z")
    db.finish_entry("n3", "convnet", "/runs/e", None, None, finished="2026-02-01T02:10:00Z", seconds=12.5)
    db.finish_night("n3", {}, finished="2026-02-01T02:10:00Z")
    assert History(v2_history, read_only=True).model_rows("convnet")[-1]["seconds"] == 12.5
    assert (db.last_seconds("convnet"), db.last_seconds("convnet", before="n3"), db.last_seconds("convnet-percentile")) == (
        12.5, None, None)


def test_entries_with_no_known_duration_are_handed_out_first_in_file_order(v2_history, tmp_path):
    """After the migration no entry has a duration: longest first hands them all out in the file's order; once one
    has a duration, the unknown ones still go first (each may be the longest)."""
    config = load_nightly(convnet_nightly(tmp_path, percentile=True))
    db = History(v2_history)
    tasks = night_tasks(config, db, "n9")
    ordered, handout = hand_out(tasks, db, "n9", Order.LONGEST_FIRST)
    assert [t.key for t in ordered] == handout.order == MODELS
    assert handout.durations == {"convnet": None, "convnet-percentile": None}
    assert str(handout) == ("handed out longest first, by each entry's last duration: convnet (no duration yet), "
                            "convnet-percentile (no duration yet)")
    db.start_night("n3", "nightly.toml", {})
    db.start_entry("n3", "convnet")
    db.finish_entry("n3", "convnet", "/runs/e", None, None, seconds=40.0)
    db.finish_night("n3", {})
    ordered, handout = hand_out(tasks, db, "n9", Order.LONGEST_FIRST)
    assert handout.order == ["convnet-percentile", "convnet"]
    assert str(handout) == ("handed out longest first, by each entry's last duration: convnet-percentile (no duration yet), "
                            "convnet 40.0 s")


def test_an_entry_that_stopped_with_an_error_gives_no_duration(tmp_path):
    """The last duration is that of the most recent entry that reached a verdict: an error may stop an entry early."""
    db = History(tmp_path / "h.sqlite")
    for night, error, seconds in (("n1", None, 30.0), ("n2", "input set photos does not exist", 0.5), ("n3", None, None)):
        db.start_night(night, "nightly.toml", {})
        db.start_entry(night, "m")
        db.finish_entry(night, "m", None, None, None, error, seconds=seconds)
        db.finish_night(night, {})
    assert db.last_seconds("m") == 30.0  # n3 finished without a measurement (it never ran), n2 stopped with an error
    with pytest.raises(ConfigError, match=r"seconds must be a number of seconds >= 0, got -1.0"):
        db.finish_entry("n3", "m", None, None, None, seconds=-1.0)
    with pytest.raises(ConfigError, match=r"seconds must be a number of seconds >= 0, got nan"):
        db.finish_entry("n3", "m", None, None, None, seconds=float("nan"))
    # the task's own start: a UTC time, and its seconds with it (the entry's finish is the start plus them)
    with pytest.raises(ConfigError, match=r"^started \(the task's own start\) needs its seconds: the entry's finish is "
                                          r"its start plus them$"):
        db.finish_entry("n3", "m", None, None, None, started="2026-02-01T02:00:00.250Z")
    with pytest.raises(ConfigError, match=r"^started must be a UTC time such as 2026-01-31T02:00:00Z, got "
                                          r"'2026-02-01T04:00:00\+02:00'$"):
        db.finish_entry("n3", "m", None, None, None, started="2026-02-01T04:00:00+02:00", seconds=1.0)
    db.finish_entry("n3", "m", None, None, None, started="2026-02-01T02:00:00.250Z", seconds=61.5, finished="2026-02-01T03:00:00Z")
    row = db.model_rows("m")[-1]
    assert (row["started"], row["finished"], row["seconds"]) == ("2026-02-01T02:00:00.250Z", "2026-02-01T02:01:01.750Z", 61.5)


def _open(path: str) -> None:
    History(path)


def test_two_writers_opening_a_version_2_file_at_once_migrate_it_once(v2_history):
    before = _rows(v2_history)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_open, args=(str(v2_history),)) for _ in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
    assert [w.exitcode for w in writers] == [0, 0, 0]  # no "duplicate column name": the migration runs once
    assert _version(v2_history) == 4 and _rows(v2_history) == before


def test_a_real_night_on_a_version_2_history_keeps_the_older_rows_as_they_were(v2_history, tmp_path):
    """The older rows keep their times (the hand-out and the recording, as version 2 wrote them), no seconds, no
    hand-out column; the new night's row holds its entry's own start and seconds; `history` shows both."""
    before = _rows(v2_history)
    older = {model: History(v2_history, read_only=True).model_rows(model) for model in MODELS}
    config = replace(load_nightly(convnet_nightly(tmp_path, percentile=True)), history=v2_history)
    night = run_nightly(config, only=["convnet"])
    [entry] = night.entries
    rows = History(v2_history, read_only=True).model_rows("convnet")
    assert rows[:2] == older["convnet"]  # every older row read as before
    assert History(v2_history, read_only=True).model_rows("convnet-percentile") == older["convnet-percentile"]
    with sqlite3.connect(v2_history) as conn:
        kept = sorted(conn.execute("SELECT night_id, model, started, finished, seconds, handed_out FROM entries "
                                   "WHERE night_id != ?", (night.night_id,)).fetchall())
    assert kept == sorted((r[0], r[1], r[5], r[6], None, None) for r in before["entries"])
    new = rows[2]
    assert (new["night_id"], new["started"], new["seconds"]) == (night.night_id, entry.started, entry.seconds)
    handed_out, started = (datetime.fromisoformat(new[k].replace("Z", "+00:00")) for k in ("handed_out", "started"))
    assert handed_out <= started  # the hand-out to the second, the entry's own start to the millisecond
    result = CliRunner().invoke(app, ["history", "convnet", "--history", str(v2_history)])
    assert result.exit_code == 0, result.output
    nights = result.stdout.split("\nchanges:\n")[0]  # the nights (with the reasons under them), then the changes
    lines = [line for line in nights.splitlines() if line.startswith("  nightly-")]
    assert len(lines) == 3
    for row, line in zip(older["convnet"], lines[:2]):
        assert line.startswith(f"  {row['night_id']}  {row['started']}  ") and "        —  convert=" in line
    assert lines[2].startswith(f"  {night.night_id}  {entry.started[:19]}Z  ") and f"  {entry.seconds:>6.1f} s  convert=" in lines[2]
