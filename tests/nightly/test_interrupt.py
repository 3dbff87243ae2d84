"""A nightly killed mid-stage leaves earlier runs and the history intact and its own runs incomplete; the
rerun starts a clean new night against the last good one. Also: progress reaches the library calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from progress_recorder import Recorder
from qconsist.errors import RunStoreError
from qconsist.history import History, model_timeline
from qconsist.nightly import load_nightly, run_nightly
from qconsist.store.rundir import RUNNING_NAME, open_run, run_state

ROOT = Path(__file__).resolve().parents[2]


def nudenet_only(folder: Path) -> Path:
    path = folder / "nightly.toml"
    path.write_text(
        f'runs_dir = "runs"\n[[models]]\nname = "nudenet-320n"\npolicy = "{ROOT / "policies" / "detector.toml"}"\n'
        '[models.pipeline.model]\nsource = "nudenet_320n"\n'
        '[models.pipeline.preprocess]\nresize = [320, 320]\nchannel_order = "RGB"\npixel_range = 1.0\n'
        '[models.pipeline.calibration]\ndata = "package:photos"\ncount = 2\nrepeat = 2\n'
        '[models.pipeline.quantize]\nactivation_type = "int16"\nweight_type = "int16"\n'
        '[models.pipeline.evaluation]\ndata = "package:photos"\noffset = 12\ncount = 2\n'
    )
    return path


def _running_stage(runs: Path, known: set[str]) -> str | None:
    for path in runs.iterdir():
        marker = path / RUNNING_NAME
        if path.name not in known and path.name.startswith("nudenet-320n-2") and marker.is_file():
            try:
                return json.loads(marker.read_text()).get("stage")
            except ValueError:
                return None
    return None


def test_killed_night_then_clean_rerun(tmp_path):
    config = nudenet_only(tmp_path)
    runs = tmp_path / "runs"
    progress = Recorder()
    first = run_nightly(load_nightly(config), progress=progress)
    assert first.passed, first.to_json()
    descriptions = [t[0] for t in progress.tasks]
    assert descriptions[0] == "nightly" and progress.tasks[0][1:] == [1, 1]
    assert "gate nudenet-320n" in descriptions and "inference + dump" in descriptions
    assert all(done == total for _, total, done in progress.tasks if total)
    before = {p.name for p in runs.iterdir()}

    process = subprocess.Popen(
        [sys.executable, "-c", "from qconsist.cli import main; main()", "nightly", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    stage, deadline = None, time.monotonic() + 240
    while stage not in ("quantize", "calib_repeat") and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
        stage = _running_stage(runs, before)
    assert stage in ("quantize", "calib_repeat"), "the nightly never reached the quantize stage"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)

    # earlier runs intact
    for name in before:
        if (runs / name).is_dir():
            assert run_state(runs / name) == "complete", name
    # the killed night's own runs: incomplete, and every reader says so
    new = sorted((runs / n for n in {p.name for p in runs.iterdir()} - before if (runs / n).is_dir()))
    night = next(p for p in new if p.name.startswith("nightly-"))
    assert all(run_state(p) == "incomplete" for p in new)
    with pytest.raises(RunStoreError, match=r"run .*nightly-.* is incomplete \(started .*, last step nudenet-320n\): it was interrupted"):
        open_run(night)
    db = History(runs / "history.sqlite")
    assert {n["night_id"]: n["status"] for n in db.nights()} == {first.night_id: "complete", night.name: "running"}

    rerun = run_nightly(load_nightly(config))
    assert rerun.passed, rerun.to_json()
    entry = rerun.entries[0]
    assert entry.baseline_night == first.night_id  # never the interrupted night
    artifacts = entry.verdict.check("artifacts")
    assert artifacts.message == "every stage's md5 matches the baseline"
    statuses = {n["night_id"]: n["status"] for n in History(runs / "history.sqlite").nights()}
    assert statuses == {first.night_id: "complete", night.name: "incomplete", rerun.night_id: "complete"}
    rows = model_timeline(History(runs / "history.sqlite"), "nudenet-320n").nights
    assert [(r["night_id"], r["status"]) for r in rows] == [
        (first.night_id, "done"), (night.name, "error"), (rerun.night_id, "done")]
    assert rows[1]["error"] == "night interrupted"
    assert run_state(night) == "incomplete"  # left as evidence, never reused
