"""Reading commands never write: ``runs list`` and ``runs rm --dry-run`` read the history database as
``history`` does (``mode=ro``: no table, ``user_version`` or journal-mode change), and a writer that meets a
read-only database says so (issue 29, items 8 and 13)."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import OutputError
from qconsist.history import History

runner = CliRunner()


def _delete_journal_history(path):
    History(path).start_night("night-1", "nightly.toml", {})
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_runs_list_and_rm_dry_run_leave_the_history_as_it_is(runs_copy):
    runs = runs_copy["runs"]
    history = runs / "history.sqlite"
    before = _delete_journal_history(history)
    for command in (["runs", "list"], ["runs", "rm", "--older-than", "0s", "--dry-run"], ["runs", "rm", "--incomplete", "--dry-run"]):
        result = runner.invoke(app, [*command, "--runs-dir", str(runs)])
        assert result.exit_code == 0, result.stderr
        assert hashlib.sha256(history.read_bytes()).hexdigest() == before, command
        assert sorted(p.name for p in runs.iterdir() if p.name.startswith("history")) == ["history.sqlite"], command
    with sqlite3.connect(f"{history.as_uri()}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_empty_history_file_names_no_baseline(runs_copy):
    runs = runs_copy["runs"]
    (runs / "history.sqlite").write_bytes(b"")
    result = runner.invoke(app, ["runs", "rm", "--older-than", "0s", "--dry-run", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.stderr
    assert (runs / "history.sqlite").read_bytes() == b""


def test_a_writer_on_a_read_only_database_says_read_only(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    History(path)
    history = History(path)
    # the connection sqlite gives a file it may not write (root writes any file: the refusal is made here by mode=ro)
    monkeypatch.setattr(History, "_open", lambda self: sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None))
    with pytest.raises(OutputError, match=r"^history database .*history.sqlite is read-only \(attempt to write a readonly "
                                          r"database\): recording needs a writable file and folder; give another one with --history$"):
        history.start_night("night-1", "nightly.toml", {})
