"""Ctrl-C for real: SIGINT sent to a running ``qconsist`` process leaves what a kill leaves (the run
incomplete, RUNNING.json saying where it stopped, the history consistent), prints one line, exits 130."""

from __future__ import annotations

import json
import os
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


def _slow_model(folder: Path, layers: int = 300, size: int = 1024) -> tuple[Path, Path]:
    """A model whose one sample takes onnxruntime many seconds on one thread (``layers`` MatMul+Tanh of
    ``size``×``size``), and two samples for it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((size, size)).astype(np.float32) / 32, "w")
    nodes, previous = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [previous, "w"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        previous = f"t{i}"
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size, size])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, size, size])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, folder / "slow.onnx")
    np.save(folder / "slow.npy", np.random.default_rng(1).standard_normal((2, size, size)).astype(np.float32))
    return folder / "slow.onnx", folder / "slow.npy"


def test_sigterm_while_onnxruntime_runs_exits_130_promptly(tmp_path):
    """SIGTERM (a cancelled CI job, ``timeout``) while onnxruntime is inside a batch of many seconds: 130 within
    the 2 s grace, not when the batch ends (11.7 s on main), the run incomplete, no scratch folder left
    (issue 29, item 7)."""
    model, samples = _slow_model(tmp_path)
    runs = tmp_path / "runs"
    process = subprocess.Popen([QCONSIST, "run", str(model), "--inputs", str(samples), "--threads", "1", "--runs-dir",
                                str(runs), "--run-id", "slow"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = runs / "slow" / RUNNING_NAME
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.05)
    time.sleep(4)  # inside onnxruntime's first batch
    assert process.poll() is None
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    took = time.monotonic() - sent
    assert (process.returncode, err) == (130, "error: interrupted\n"), (process.returncode, err)
    assert took < 4.0, took
    assert run_state(runs / "slow") == "incomplete" and marker.is_file()
    assert not (runs / "slow" / ".scratch").exists()


ENTRY = ("import os, signal, sys, threading\n"
         "threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGINT)).start()\n"
         "sys.argv = ['qconsist', 'runs', 'list', '--runs-dir', sys.argv[2]]\n"
         "from qconsist.__main__ import main\n"
         "main()\n")


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3])
def test_ctrl_c_while_the_command_line_loads(tmp_path, delay):
    """Ctrl-C in the first 0.4 s, while the command (typer, rich, the commands) is imported: one line and 130, or
    the command's own result if it was quicker — never a KeyboardInterrupt traceback and -2 (issue 29, item 9).
    The signal is sent from inside the process, timed from just before its entry point is imported (the
    interpreter's own start, 0.05-0.2 s before that, and the first milliseconds of importing the ``qconsist``
    package itself are Python's)."""
    (tmp_path / "runs").mkdir()
    done = subprocess.run([sys.executable, "-c", ENTRY, str(delay), str(tmp_path / "runs")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert (done.returncode, done.stderr) in ((130, "error: interrupted\n"), (0, "")), (done.returncode, done.stderr)
    if delay <= 0.1:  # the command line takes longer than that to load
        assert done.returncode == 130


def test_an_ascii_terminal_gets_escapes_not_an_error(tmp_path):
    """``PYTHONIOENCODING=ascii``: what the stream cannot hold ("→") is written as ``\\u2192`` (issue 29, item 9)."""
    model = build_classifier_model(tmp_path / "classifier.onnx")
    arrays = save_arrays(tmp_path / "arrays.npy", 2, seed=2)
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([QCONSIST, "run", str(model), "--inputs", str(arrays), "--runs-dir", "runs", "--run-id", "r"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run([QCONSIST, "inspect", "runs/r"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    assert shown.stdout.splitlines()[0].startswith("run runs/r: inference, complete, ") and " \\u2192 " in shown.stdout
