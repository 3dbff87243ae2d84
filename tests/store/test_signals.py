"""Ctrl-C for real: SIGINT sent to a running ``qconsist`` process leaves what a kill leaves (the run
incomplete, RUNNING.json saying where it stopped, the history consistent), prints one line, exits 130."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onnx_builders import build_classifier_model, save_arrays
from qconsist.errors import RunStoreError
from qconsist.store.rundir import RUNNING_NAME, open_run, run_state

QCONSIST = str(Path(sys.executable).parent / "qconsist")


def _interrupt_when(command: list[str], ready, cwd: Path, timeout: float = 120) -> tuple[int, str, str]:
    """Start ``command``, wait until ``ready()``, send SIGINT; (exit code, stdout, stderr without the progress
    lines a piped command prints every 10 s of work)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None and not ready():
        time.sleep(0.02)
    assert process.poll() is None, f"finished before the signal: {process.communicate()}"
    assert ready(), "never reached the point to interrupt"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, "".join(line for line in err.splitlines(keepends=True) if not line.startswith("progress "))


def _stage(marker: Path) -> str | None:
    try:
        return json.loads(marker.read_text()).get("stage")
    except (OSError, ValueError):
        return None


def test_sigint_during_pipeline_leaves_it_incomplete(tmp_path):
    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "arrays.npy", 2000, seed=2)
    pipeline = tmp_path / "long.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "{arrays}"\nrepeat = 100\n')
    runs = tmp_path / "runs"
    marker = runs / "cut" / RUNNING_NAME
    code, _, err = _interrupt_when(
        [QCONSIST, "pipeline", "run", str(pipeline), "--runs-dir", str(runs), "--run-id", "cut"],
        lambda: _stage(marker) == "calib_repeat", tmp_path)
    assert code == 130
    assert err == "error: interrupted\n"
    assert run_state(runs / "cut") == "incomplete"
    assert not (runs / "cut" / "manifest.json").exists()
    assert _stage(marker) == "calib_repeat"
    with pytest.raises(RunStoreError, match=r"run .*cut is incomplete \(started .*, last step calib_repeat\)"):
        open_run(runs / "cut")


def test_sigint_during_dump_leaves_it_incomplete(tmp_path):
    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "many.npy", 20000, seed=3)
    runs = tmp_path / "runs"
    raw = runs / "dumping" / "dump" / "raw"  # one archive per sample: the dump is under way
    code, out, err = _interrupt_when(
        [QCONSIST, "run", str(model), "--inputs", str(arrays), "--dump", "--raw", "all", "--runs-dir", str(runs),
         "--run-id", "dumping"],
        lambda: raw.is_dir() and len(list(raw.iterdir())) > 20, tmp_path)
    assert code == 130
    assert err == "error: interrupted\n"
    assert out == ""
    assert run_state(runs / "dumping") == "incomplete"
    from typer.testing import CliRunner

    from qconsist.cli import app

    result = CliRunner().invoke(app, ["verify", str(runs / "dumping")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: run {runs / 'dumping'} is incomplete (started ")


def test_sigint_during_nightly_keeps_history_consistent(tmp_path):
    """The night's runs are left incomplete, as a killed night's are, and the history says so at once (the
    night ``incomplete``); the next nightly starts afresh."""
    from qconsist.history import History
    from qconsist.nightly import load_nightly, run_nightly

    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "arrays.npy", 2000, seed=2)
    config = tmp_path / "nightly.toml"
    config.write_text(
        'runs_dir = "runs"\n[[models]]\nname = "tiny"\n'
        f'[models.pipeline.model]\nonnx = "{model}"\n'
        f'[models.pipeline.calibration]\ndata = "{arrays}"\ncount = 2000\nrepeat = 100\n'
        f'[models.pipeline.evaluation]\ndata = "{arrays}"\ncount = 4\n'
    )
    runs = tmp_path / "runs"
    history = runs / "history.sqlite"

    def calibrating() -> bool:
        return runs.is_dir() and any(_stage(p / RUNNING_NAME) == "calib_repeat" for p in runs.iterdir())

    code, _, err = _interrupt_when([QCONSIST, "nightly", str(config)], calibrating, tmp_path, timeout=240)
    assert code == 130
    assert err == "error: interrupted\n"
    night = next(p for p in runs.iterdir() if p.name.startswith("nightly-"))
    assert run_state(night) == "incomplete"
    assert all(run_state(p) == "incomplete" for p in runs.iterdir() if p.is_dir())
    assert [n["status"] for n in History(history).nights()] == ["incomplete"]
    config.write_text(config.read_text().replace("repeat = 100", "repeat = 2").replace("count = 2000", "count = 12"))
    rerun = run_nightly(load_nightly(config))
    statuses = {n["night_id"]: n["status"] for n in History(history).nights()}
    assert statuses == {night.name: "incomplete", rerun.night_id: "complete"}
