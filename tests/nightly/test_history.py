"""The SQLite history: what it records, the timeline of changes, overlap of two writers, interrupted nights."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys

import pytest

from qconsist.environment import fingerprint
from qconsist.errors import InputError, RunStoreError
from qconsist.gate import CheckResult, CheckStatus, GateVerdict
from qconsist.history import History, model_timeline


def _verdict(passed: bool) -> GateVerdict:
    status = CheckStatus.PASS if passed else CheckStatus.FAIL
    return GateVerdict(model="m", candidate="c", baseline=None, policy={}, checks=[
        CheckResult("artifacts", status, "ok" if passed else "stage 'quantize' changed")],
        changed_stages=[] if passed else ["quantize"], first_diverging_node=None if passed else "conv1")


def _stages(quantize_md5: str) -> list[dict]:
    return [{"name": "convert", "artifact": {"md5": "c" * 32, "sha256": "s", "content": "x"}},
            {"name": "quantize", "artifact": {"md5": quantize_md5, "sha256": "s", "content": "y"}}]


def _night(db: History, night: str, env: dict, md5: str, passed: bool | None, error: str | None = None) -> None:
    db.start_night(night, "nightly.toml", env)
    db.start_entry(night, "m")
    db.record_run(night, "m", "pipeline", f"p-{night}", "pipeline", f"/runs/p-{night}")
    db.record_hashes(night, "m", _stages(md5))
    verdict = None if passed is None else _verdict(passed)
    db.finish_entry(night, "m", f"/runs/e-{night}", verdict, None, error)
    db.finish_night(night, {"pass": int(bool(passed))})


def test_timeline_names_first_change_and_environment(tmp_path, monkeypatch):
    db = History(tmp_path / "h.sqlite")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env1 = fingerprint()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env2 = fingerprint()
    _night(db, "n1", env1, "a" * 32, True)
    _night(db, "n2", env1, "a" * 32, True)
    _night(db, "n3", env2, "b" * 32, False)
    _night(db, "n4", env2, "b" * 32, False)
    timeline = model_timeline(db, "m")
    assert [n["night_id"] for n in timeline.nights] == ["n1", "n2", "n3", "n4"]
    hash_change = timeline.first_change("hash", "quantize")
    assert (hash_change.night_id, hash_change.previous_night) == ("n3", "n2")
    assert hash_change.environment == ("env.OMP_NUM_THREADS: None -> '1'",)
    verdict_change = timeline.first_change("verdict")
    assert (verdict_change.old, verdict_change.new, verdict_change.night_id) == ("pass", "fail", "n3")
    assert timeline.first_change("hash", "convert") is None
    assert len(timeline.changes) == 2  # n4 repeats n3: nothing new
    assert db.last_good("m").night_id == "n2"
    assert db.last_good("m", before="n2").night_id == "n1"
    assert timeline.nights[2]["verdict"]["reasons"] == ["artifacts: stage 'quantize' changed"]
    assert timeline.nights[2]["runs"] == {"pipeline": "/runs/p-n3"}


def test_errors_are_recorded_and_never_a_baseline(tmp_path):
    db = History(tmp_path / "h.sqlite")
    _night(db, "n1", {}, "a" * 32, None, error="input set photos does not exist")
    assert db.last_good("m") is None
    row = model_timeline(db, "m").nights[0]
    assert row["status"] == "error" and row["error"] == "input set photos does not exist"


def test_unknown_model_and_bad_databases(tmp_path):
    db = History(tmp_path / "h.sqlite")
    _night(db, "n1", {}, "a" * 32, True)
    with pytest.raises(InputError, match=r"no nightly history for model 'x' in .*h.sqlite; models: m"):
        model_timeline(db, "x")
    future = tmp_path / "future.sqlite"
    with sqlite3.connect(future) as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(RunStoreError, match=r"has schema version 7; this qconsist reads versions 1 to 4$"):
        History(future)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RunStoreError, match=r"history database .*junk.sqlite is unusable: file is not a database"):
        History(junk)


def _writer(path: str, prefix: str, count: int) -> None:
    db = History(path)
    for i in range(count):
        night = f"{prefix}{i:03d}"
        db.start_night(night, "nightly.toml", {"writer": prefix})
        db.start_entry(night, "m")
        db.record_hashes(night, "m", _stages(f"{i:032d}"))
        db.finish_entry(night, "m", f"/e/{night}", _verdict(i % 2 == 0), None)
        db.finish_night(night, {})


def test_two_overlapping_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "h.sqlite")
    History(path)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(path, p, 40)) for p in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0, 0]
    db = History(path)
    nights = db.nights()
    assert len(nights) == 80 and all(n["status"] == "complete" for n in nights)
    assert len(model_timeline(db, "m").nights) == 80
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT COUNT(*) FROM hashes").fetchone()[0] == 160


def test_night_of_a_dead_process_is_marked_incomplete(tmp_path):
    path = tmp_path / "h.sqlite"
    code = (
        "from qconsist.history import History; db = History(%r); db.start_night('dead', 'n.toml', {});"
        "db.start_entry('dead', 'm')" % str(path)
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    db = History(path)
    db.start_night("alive", "n.toml", {})  # this process: still running, not touched
    assert db.mark_abandoned() == ["dead"]
    status = {n["night_id"]: n["status"] for n in db.nights()}
    assert status == {"dead": "incomplete", "alive": "running"}
    row = model_timeline(db, "m").nights[0]
    assert (row["status"], row["error"]) == ("error", "night interrupted")
    # it never reported a start of its own: started stays the hand-out time, and nothing was measured
    assert (row["started"], row["seconds"]) == (row["handed_out"], None) and row["started"] <= row["finished"]


def test_nights_started_in_the_same_second_keep_their_order(tmp_path):
    """Start times have one-second resolution: a killed night and its rerun can share one; names are random."""
    db = History(tmp_path / "h.sqlite")
    env = fingerprint()
    for night in ("z-first", "a-second", "m-third"):  # names sort against insertion order
        _night(db, night, env, "a" * 32, True)
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:
        conn.execute("UPDATE nights SET started = '2026-01-01T00:00:00Z'")
        conn.execute("UPDATE entries SET started = '2026-01-01T00:00:00Z'")
    assert [n["night_id"] for n in db.nights()] == ["z-first", "a-second", "m-third"]
    assert [n["night_id"] for n in model_timeline(db, "m").nights] == ["z-first", "a-second", "m-third"]
    assert db.last_good("m").night_id == "m-third"
