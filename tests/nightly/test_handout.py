"""The order a night hands its tasks out in (``qconsist.nightly.order``): the local executor keeps the file's order;
the durations the next night uses are the tasks' own seconds, recorded in the history; older summaries load."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nightly_files import convnet_entries
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.history import History
from qconsist.nightly import NightlyResult, Order, load_nightly, night_tasks, run_nightly
from qconsist.nightly.order import hand_out, list_schedule

NAMES = ["alpha", "beta", "gamma"]


def test_the_local_executor_keeps_the_files_order_and_records_each_tasks_seconds(tmp_path):
    path = convnet_entries(tmp_path, NAMES)
    first = run_nightly(load_nightly(path))
    assert [e.model for e in first.entries] == NAMES and first.passed
    assert first.handout is not None and first.handout.rule is Order.FILE and first.handout.order == NAMES
    history = History(tmp_path / "runs" / "history.sqlite", read_only=True)
    for entry in first.entries:  # the task's own seconds, measured in it, are what the history keeps
        assert 0 < entry.seconds < first.seconds and entry.started is not None
        assert [row["seconds"] for row in history.model_rows(entry.model)] == [entry.seconds]
    # the second night, through the CLI: the order and why, in one line
    result = CliRunner().invoke(app, ["nightly", str(path)])
    assert result.exit_code == 0, result.output
    assert ("handed out in the file's order (the local executor runs one entry after another: the order changes nothing "
            "of the wall time)\n") in result.stdout
    night = sorted((tmp_path / "runs").glob("nightly-*"))[-1]
    summary = json.loads((night / "summary.json").read_text())
    assert summary["handout"] == {"rule": "file", "order": NAMES, "durations": {},
                                  "reason": "the local executor runs one entry after another: the order changes nothing of the wall time"}
    assert ('<p class="muted">handed out in the file&#x27;s order (the local executor runs one entry after another: '
            'the order changes nothing of the wall time).</p>') in (night / "report.html").read_text()
    # longest first would use the first night's seconds, longest first
    db = History(tmp_path / "runs" / "history.sqlite")
    tasks = night_tasks(load_nightly(path), db, "next")
    ordered, handout = hand_out(tasks, db, "next", Order.LONGEST_FIRST)
    seconds = {e.model: db.last_seconds(e.model) for e in first.entries}
    assert handout.durations == seconds and None not in seconds.values()
    assert handout.order == sorted(NAMES, key=lambda name: -seconds[name]) == [t.key for t in ordered]


def test_an_older_summary_without_the_order_or_start_times_still_loads(tmp_path):
    path = convnet_entries(tmp_path, NAMES[:1])
    result = run_nightly(load_nightly(path))
    data = json.loads((result.path / "summary.json").read_text())
    del data["handout"]
    for entry in data["entries"]:
        del entry["started"]
    older = NightlyResult.from_json(data)
    assert older.handout is None and older.entries[0].started is None
    assert older.entries[0].seconds == round(result.entries[0].seconds, 3) > 0


def test_list_scheduling_of_the_h200_night():
    """The two-GPU night of issue 31 (seconds of each entry, file order): handed out in the file's order the last
    entry (NudeNet) ends the night at 217.3 s (218.1 s measured); longest first, at 170.1 s."""
    seconds = {"open_nsfw-minmax": 74.4, "open_nsfw-percentile": 66.4, "nudenet-320n": 150.9, "fcn_head": 19.2,
               "fcn_head-determinized": 21.5}
    assert list_schedule(list(seconds.values()), 2) == pytest.approx(217.3)
    assert list_schedule(sorted(seconds.values(), reverse=True), 2) == pytest.approx(170.1)
    assert list_schedule(list(seconds.values()), 1) == pytest.approx(sum(seconds.values()))
    with pytest.raises(ValueError, match="slots must be >= 1, got 0"):
        list_schedule([1.0], 0)


def test_an_unknown_order_is_refused_before_the_night_starts(tmp_path):
    path = convnet_entries(tmp_path, NAMES[:1])
    with pytest.raises(ConfigError) as caught:
        run_nightly(load_nightly(path), order="shortest-first")
    assert caught.value.template == "unknown hand-out `order` 'shortest-first'; choose one of: longest-first, file"
    assert not (tmp_path / "runs").exists()


def test_the_cli_chooses_the_order(tmp_path):
    """``--order longest-first`` with the local executor: one after another, longest first by the last night's seconds."""
    path = convnet_entries(tmp_path, NAMES)
    first = run_nightly(load_nightly(path))
    seconds = {e.model: e.seconds for e in first.entries}
    expected = sorted(NAMES, key=lambda name: -seconds[name])
    result = CliRunner().invoke(app, ["nightly", str(path), "--order", "longest-first", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["handout"]["order"] == expected and data["handout"]["reason"] == "asked for"
    assert [e["model"] for e in data["entries"]] == NAMES  # listed in the file's order
    started = {e["model"]: e["started"] for e in data["entries"]}
    assert sorted(NAMES, key=lambda name: started[name]) == expected  # run one after another, longest first
    result = CliRunner().invoke(app, ["nightly", str(path), "--order", "shortest-first"])
    assert (result.exit_code, result.stderr) == (
        2, "error: unknown hand-out --order 'shortest-first'; choose one of: longest-first, file\n")
