"""A history of schema version 1 (tests/data/history_v1.sql, written by an older qconsist from two real nights):
read as it is by a reader, migrated in place by a writer, and the same either way."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.history import History, model_timeline, summarize_history
from qconsist.history.db import SCHEMA_VERSION, TABLES_BY_VERSION
from qconsist.history.figures import verdict_figures

MODELS = ["convnet", "convnet-percentile"]


def _verdicts(path: Path) -> dict[tuple[str, str], dict]:
    with sqlite3.connect(path) as conn:
        return {(night, model): json.loads(text) for night, model, text in conn.execute("SELECT night_id, model, verdict FROM verdicts")}


def _tables(path: Path) -> tuple[int, list[str]]:
    with sqlite3.connect(path) as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return version, sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


def test_the_fixture_is_a_version_1_history_of_two_real_nights(v1_history):
    path = v1_history
    assert _tables(path) == (1, sorted(TABLES_BY_VERSION[1]))
    verdicts = _verdicts(path)
    assert len(verdicts) == 4 and sorted({model for _, model in verdicts}) == MODELS
    failed = [v for v in verdicts.values() if not v["passed"]]
    assert len(failed) == 2 and all(v["first_diverging_node"] and v["origin_nodes"] for v in failed)


def test_a_reader_reads_version_1_as_it_is(v1_history, tmp_path):
    path = v1_history
    before = path.read_bytes()
    db = History(path, read_only=True)
    assert db.version == 1
    verdicts = _verdicts(path)
    for model in MODELS:
        rows = db.model_rows(model)
        assert len(rows) == 2
        for row in rows:
            recorded = verdicts[(row["night_id"], model)]
            assert row["figures"] == verdict_figures(recorded) and row["figures"]["drift.float.max_abs_diff"] > 0
            assert row["verdict"]["origin_nodes"] == recorded["origin_nodes"]
            assert (row["gpu_type"], row["gpus"]) == (None, [])  # this machine has no GPU: the night's environment says so
    summary = summarize_history(db)
    assert [s.key for s in summary.series] == MODELS
    assert [n.status for n in summary.series[0].nights] == ["pass", "fail"]
    assert summary.series[0].nights[1].changed == ("quantize",)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "h.sqlite"]


def test_a_writer_migrates_version_1_and_reads_the_same(v1_history):
    path = v1_history
    as_read = {model: History(path, read_only=True).model_rows(model) for model in MODELS}
    db = History(path)  # a writer (the next nightly) migrates it
    assert db.version == SCHEMA_VERSION == 4
    assert _tables(path) == (4, sorted(TABLES_BY_VERSION[4]))
    with sqlite3.connect(path) as conn:
        figures = conn.execute("SELECT COUNT(*) FROM figures").fetchone()[0]
    assert figures == sum(len(verdict_figures(v)) for v in _verdicts(path).values()) > 0
    for model in MODELS:
        migrated = History(path, read_only=True).model_rows(model)
        assert migrated == as_read[model]  # figures and origin nodes filled from the verdicts, as a reader derives them
    # the migrated history goes on: a new night records its GPUs and figures in the new columns
    db.start_night("n3", "nightly.toml", {}, started="2026-02-01T02:00:00Z")
    db.start_entry("n3", "convnet", started="2026-02-01T02:00:00Z")
    db.finish_entry("n3", "convnet", None, None, None, "its worker was lost", gpu_type="H100", gpus=["NVIDIA H100 80GB HBM3"],
                    finished="2026-02-01T02:10:00Z")
    db.record_figures("n3", "convnet", {"accuracy.top1": 0.75})
    db.finish_night("n3", {}, finished="2026-02-01T02:10:00Z")
    last = History(path, read_only=True).model_rows("convnet")[-1]
    assert (last["gpu_type"], last["gpus"], last["figures"], last["night_started"]) == (
        "H100", ["NVIDIA H100 80GB HBM3"], {"accuracy.top1": 0.75}, "2026-02-01T02:00:00Z")
    assert model_timeline(History(path, read_only=True), "convnet").first_change("verdict").new == "fail"
    result = CliRunner().invoke(app, ["history", "convnet", "--history", str(path), "--json"])
    assert result.exit_code == 0, result.output
    nights = json.loads(result.stdout)["nights"]
    assert [n["figures"].get("accuracy.top1") for n in nights] == [None, None, 0.75]


def _open(path: str) -> None:
    History(path)


def test_two_writers_opening_a_version_1_file_at_once_migrate_it_once(v1_history):
    path = v1_history
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_open, args=(str(path),)) for _ in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
    assert [w.exitcode for w in writers] == [0, 0, 0]  # no "duplicate column name": the migration runs once
    assert _tables(path) == (4, sorted(TABLES_BY_VERSION[4]))


@pytest.mark.parametrize("value, message", [
    ("yesterday", r"started must be a UTC time such as 2026-01-31T02:00:00Z, got 'yesterday'"),
    ("2026-01-31T02:00:00+02:00", r"started must be a UTC time such as 2026-01-31T02:00:00Z, got '2026-01-31T02:00:00\+02:00'"),
])
def test_explicit_times_are_utc(tmp_path, value, message):
    from qconsist.errors import ConfigError

    db = History(tmp_path / "h.sqlite")
    with pytest.raises(ConfigError, match=message):
        db.start_night("n1", "nightly.toml", {}, started=value)
    db.start_night("n1", "nightly.toml", {}, started="2026-01-31T02:00:00")  # naive: read as UTC
    assert db.nights()[0]["started"] == "2026-01-31T02:00:00Z"


@pytest.mark.parametrize("figures, message", [
    ({"Accuracy": 0.5}, r"figure name 'Accuracy' must be dotted lower-case words such as 'accuracy.top1'"),
    ({"accuracy.top1": float("nan")}, r"figure accuracy.top1 must be a number, got nan"),
    ({"accuracy.top1": True}, r"figure accuracy.top1 must be a number, got True"),
    ({"accuracy.top1": "0.5"}, r"figure accuracy.top1 must be a number, got '0.5'"),
    ([("accuracy.top1", 0.5)], r"figures must be a mapping of name to number, got list"),
])
def test_recorded_figures_are_checked(tmp_path, figures, message):
    from qconsist.errors import ConfigError

    db = History(tmp_path / "h.sqlite")
    with pytest.raises(ConfigError, match=message):
        db.record_figures("n1", "m", figures)
    db.record_figures("n1", "m", {"drift.float.max_abs_diff": float("inf")})  # an overflowed difference is one
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:
        assert conn.execute("SELECT value FROM figures").fetchone()[0] == float("inf")
