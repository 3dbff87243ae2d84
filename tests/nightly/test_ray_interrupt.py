"""Ctrl-C during a night on Ray: the outstanding tasks are cancelled, `qconsist nightly` exits 130, and the
history is consistent at once — the night ``incomplete``, its unfinished entry ``night interrupted``, its
run directories incomplete — without waiting for the next nightly to notice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from typer.testing import CliRunner

from nightly_files import derived_nightly
from qconsist.cli import app
from qconsist.history import History, model_timeline
from qconsist.store.rundir import RUNNING_NAME, run_state


def test_ctrl_c_cancels_the_tasks_and_leaves_the_history_consistent(tmp_path):
    config = derived_nightly(tmp_path, ["fcn_head-determinized"])
    runs = tmp_path / "runs"
    process = subprocess.Popen(
        [sys.executable, "-c", "from qconsist.cli import main; main()", "nightly", str(config), "--executor", "ray"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stage, deadline = None, time.monotonic() + 180
    while stage != "pipeline" and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
        for entry in runs.glob("fcn_head-determinized-entry-*") if runs.is_dir() else ():
            try:
                stage = json.loads((entry / RUNNING_NAME).read_text()).get("stage")
            except (OSError, ValueError):
                pass
    assert stage == "pipeline", "the entry never started on Ray"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.endswith("error: interrupted\n")

    db = History(runs / "history.sqlite")
    [night] = db.nights()
    assert night["status"] == "incomplete"
    [row] = model_timeline(db, "fcn_head-determinized").nights
    assert (row["status"], row["error"]) == ("error", "night interrupted")
    made = [p for p in runs.iterdir() if p.is_dir()]
    assert {p.name.split("-2")[0] for p in made} >= {"nightly", "fcn_head-determinized-entry"}
    assert all(run_state(p) == "incomplete" for p in made)

    # the next night starts clean and judges the model without the interrupted night as its baseline
    rerun = CliRunner().invoke(app, ["nightly", str(config), "--json"])
    assert rerun.exit_code == 0, rerun.output
    data = json.loads(rerun.stdout)
    assert data["entries"][0]["baseline"] is None and data["entries"][0]["status"] == "pass"
    assert [n["status"] for n in History(runs / "history.sqlite").nights()] == ["incomplete", "complete"]
