"""On a real local Ray of 2 CPUs (tasks of 1 CPU: two run at once), a night's tasks are handed out longest first by
each entry's last duration in the history, an entry with none first; Ray starts them in that order; outcomes,
results, summaries and history rows stay in the nightly file's order; each history row holds its entry's own start
and finish, as its Ray worker measured them."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta

import pytest
import ray  # the test group installs it (pyproject: qconsist[ray])
from typer.testing import CliRunner

from nightly_files import convnet_entries
from qconsist.cli import app
from qconsist.history import History

FILE_ORDER = ["alpha", "beta", "gamma", "delta"]
EARLIER = {"alpha": 10.0, "beta": 30.0, "delta": 50.0}  # gamma is new: no duration yet


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False, object_store_memory=128 * 2**20)
    yield
    ray.shutdown()


def _earlier_night(path) -> None:
    """A night the history holds: the durations of three of the four entries (gamma is new)."""
    db = History(path)
    db.start_night("earlier", "nightly.toml", {}, started="2026-11-01T02:00:00Z")
    for name, seconds in EARLIER.items():
        db.start_entry("earlier", name, started="2026-11-01T02:00:00Z")
        db.finish_entry("earlier", name, f"/runs/{name}-entry", None, None, finished="2026-11-01T02:05:00Z", seconds=seconds)
    db.finish_night("earlier", {}, finished="2026-11-01T02:05:00Z")


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_ray_hands_out_longest_first_and_records_in_file_order(tmp_path):
    path = convnet_entries(tmp_path, FILE_ORDER)
    history = tmp_path / "runs" / "history.sqlite"
    _earlier_night(history)
    result = CliRunner().invoke(app, ["nightly", str(path), "--executor", "ray"])
    assert result.exit_code == 0, result.output
    assert ("handed out longest first, by each entry's last duration: gamma (no duration yet), delta 50.0 s, "
            "beta 30.0 s, alpha 10.0 s\n") in result.stdout
    night = sorted((tmp_path / "runs").glob("nightly-*"))[-1]
    summary = json.loads((night / "summary.json").read_text())
    assert summary["handout"] == {"rule": "longest-first", "order": ["gamma", "delta", "beta", "alpha"], "reason": "",
                                  "durations": {"alpha": 10.0, "beta": 30.0, "gamma": None, "delta": 50.0}}
    entries = {e["model"]: e for e in summary["entries"]}
    assert [e["model"] for e in summary["entries"]] == FILE_ORDER and all(e["status"] == "pass" for e in entries.values())
    # 2 CPUs: gamma and delta start at once; beta and alpha wait for a free CPU, so they start after both
    started = {name: _when(entries[name]["started"]) for name in FILE_ORDER}
    assert max(started["gamma"], started["delta"]) < min(started["beta"], started["alpha"])
    assert started["beta"] <= started["alpha"]
    lines = result.stdout.splitlines()
    shown = [next(i for i, line in enumerate(lines) if line.startswith(f"  PASS  {name}  (")) for name in FILE_ORDER]
    assert shown == sorted(shown)  # the CLI lists the entries in the file's order
    # the history: written in the file's order, each entry with its task's own seconds
    with sqlite3.connect(history) as conn:
        night_id = summary["night_id"]
        verdicts = [r[0] for r in conn.execute("SELECT model FROM verdicts WHERE night_id = ? ORDER BY rowid", (night_id,))]
        runs = list(dict.fromkeys(r[0] for r in conn.execute("SELECT model FROM runs WHERE night_id = ? ORDER BY rowid", (night_id,))))
        seconds = dict(conn.execute("SELECT model, seconds FROM entries WHERE night_id = ?", (night_id,)).fetchall())
    assert verdicts == runs == FILE_ORDER
    # each row holds its entry's own times, as its Ray worker measured them: not the submission, which was at once
    # for all four, nor the recording, in the file's order; the submission is handed_out
    with sqlite3.connect(history) as conn:
        times = {r[0]: r[1:] for r in conn.execute("SELECT model, started, finished FROM entries WHERE night_id = ?", (night_id,))}
    assert {name: times[name][0] for name in FILE_ORDER} == {name: entries[name]["started"] for name in FILE_ORDER}
    with sqlite3.connect(history) as conn:
        times = {r[0]: (*times[r[0]], r[1]) for r in conn.execute("SELECT model, handed_out FROM entries WHERE night_id = ?",
                                                                 (night_id,))}
    own = {name: (_when(times[name][0]), _when(times[name][1])) for name in FILE_ORDER}
    assert max(own["gamma"][0], own["delta"][0]) < min(own["beta"][0], own["alpha"][0])  # as Ray started them
    # 2 CPUs: beta and alpha each started once an earlier task had finished and freed its CPU
    assert min(own["gamma"][1], own["delta"][1]) <= min(own["beta"][0], own["alpha"][0]) + timedelta(milliseconds=2)
    for name in FILE_ORDER:
        assert (own[name][1] - own[name][0]).total_seconds() == pytest.approx(entries[name]["seconds"], abs=2e-3)
        assert _when(times[name][2]) <= own[name][0]
    assert seconds == {name: pytest.approx(entries[name]["seconds"], abs=1e-3) for name in FILE_ORDER}
    assert all(0 < s < summary["seconds"] for s in seconds.values())
    # the next night: the durations this night measured, longest first
    db = History(history, read_only=True)
    assert {name: db.last_seconds(name) for name in FILE_ORDER} == seconds
