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


# The ``qconsist`` script's own lines (``from qconsist.__main__ import main``; ``main()``), with a byte written to the
# parent once ``main``'s first step is done (its handlers installed; ``main`` does it again, a no-op): the parent's
# clock starts there. What comes before is the interpreter's own start (its ``site`` module: 15-50 ms, more
# without bytecode), where a Ctrl-C ends in CPython's own error.
STARTED = ("import os, sys\n"
           "from qconsist.__main__ import interrupt, main\n"
           "interrupt.install()\n"
           "os.write(int(sys.argv[1]), b'.')\n"
           "sys.argv = ['qconsist', *sys.argv[2:]]\n"
           "main()\n")


def _bytecode(tmp_path: Path, available: bool) -> dict[str, str]:
    """The environment of a ``qconsist`` process that finds every module's bytecode (written into a folder of
    its own by a first run: see ``_sweep``) or none (an empty folder, nothing written: every module compiled as
    it is imported, as on a machine with PYTHONDONTWRITEBYTECODE=1 and no bytecode installed)."""
    folder = tmp_path / ("pycache" if available else "no-pycache")
    folder.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPYCACHEPREFIX": str(folder), "PYTHONDONTWRITEBYTECODE": "1", "NO_COLOR": "1"}


def _interrupt_at(args: list[str], delay: float, env: dict[str, str], cwd: Path) -> tuple[int, str, str, float, float]:
    """``qconsist ARGS`` sent SIGINT ``delay`` seconds after its ``main`` started (``STARTED``): (exit code,
    stdout, stderr, seconds from the signal to the process's end, the signal's wall-clock time)."""
    read, write = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-c", STARTED, str(write), *args], cwd=cwd, env=env,
                                   pass_fds=(write,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(write)
        assert os.read(read, 1) == b".", process.communicate()
    finally:
        os.close(read)
    time.sleep(delay)
    sent, wall = time.monotonic(), time.time()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err, time.monotonic() - sent, wall


def _sweep(tmp_path: Path, name: str, args, delays: dict[bool, list[float]]) -> list[tuple[str, int, float]]:
    """``qconsist`` interrupted at each delay, with and without bytecode (two at a time): each must end with exit
    130 and the one line, or — a signal that came as the process was ending — with the command's own complete
    result, within 0.25 s of the signal. ``args(tag)`` gives the arguments of one process (its run id). Returns
    each outcome's line (for the message of a failure), exit code and the signal's wall-clock time."""
    from concurrent.futures import ThreadPoolExecutor

    env = {True: _bytecode(tmp_path, True), False: _bytecode(tmp_path, False)}
    warm = subprocess.run([QCONSIST, *args("warm")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env[True], "PYTHONDONTWRITEBYTECODE": ""})  # writes every module's bytecode
    assert warm.returncode == 0, warm.stderr
    cases = [(available, delay, f"{name}-{'pyc' if available else 'nopyc'}-{delay:.2f}")
             for available, ds in delays.items() for delay in ds]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: _interrupt_at(args(case[2]), case[1], env[case[0]], tmp_path), cases))
    outcomes, wrong, interrupted = [], [], 0
    for (available, delay, tag), (code, out, err, after, wall) in zip(cases, results):
        outcomes.append((f"{tag}: exit {code}, {after:.2f} s after the signal, stderr {err[-300:]!r}", code, wall))
        if code == 130:
            interrupted += 1
            right = err == "error: interrupted\n"
        else:  # not an interrupt that was lost: the process was ending, its output complete
            right = (code, err) == (0, warm.stderr) and out.split()[:1] == warm.stdout.split()[:1] and after < 0.25
        if not right:
            wrong.append(outcomes[-1][0])
    assert not wrong, f"{len(wrong)} of {len(cases)} wrong:\n" + "\n".join(wrong)
    assert interrupted >= len(cases) // 3, outcomes  # the command outlasted enough of the delays: they tested it
    return outcomes


def test_ctrl_c_at_any_instant_of_a_run(tmp_path):
    """SIGINT at every 0.1 s of a `qconsist run` (images decoded by 2 worker processes), with bytecode and without
    it (then interleaved 0.05 s later): exit 130 and ``error: interrupted`` each time, never a traceback, an abort,
    exit 4 or a silent 130 (typer's parsing imports pydantic and turned a Ctrl-C there into exit 130 without a
    word), and the run directory complete or left incomplete, never anything else (issue 31). A run recorded
    complete before the signal came may still end with 130: the signal came while the process was ending (its last
    tens of milliseconds), and an interrupted process says so; a run completed after the signal may not."""
    model = build_classifier_model(tmp_path / "classifier.onnx")
    pipeline = tmp_path / "tiny.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "package:photos"\n'
                        '[preprocess]\nresize = [8, 8]\npixel_range = 1.0\n')
    runs = tmp_path / "runs"

    def args(tag: str) -> list[str]:
        return ["run", str(model), "--inputs", "package:photos", "--pipeline", str(pipeline), "--count", "4",
                "--workers", "2", "--runs-dir", str(runs), "--run-id", tag]

    delays = {True: [round(0.1 * i, 2) for i in range(13)], False: [round(0.05 + 0.1 * i, 2) for i in range(15)]}
    outcomes = _sweep(tmp_path, "run", args, delays)
    for line, code, signalled in outcomes:  # what a kill leaves, or the whole run: nothing else
        tag = line.split(":")[0]
        state = run_state(runs / tag)
        if code == 0:
            assert state == "complete", line
        elif state == "complete":  # recorded before the signal came, the process then ending (see above)
            assert (runs / tag / "manifest.json").stat().st_mtime <= signalled, line
        else:
            assert state in ("incomplete", "missing"), line
        assert not (runs / tag / ".scratch").exists(), line


def test_ctrl_c_at_any_instant_of_env(tmp_path):
    """The same for `qconsist env` (numpy, onnx and onnxruntime loaded, nothing written): 130 and the one line."""
    delays = {True: [round(0.1 * i, 2) for i in range(8)], False: [round(0.05 + 0.1 * i, 2) for i in range(12)]}
    _sweep(tmp_path, "env", lambda tag: ["env"], delays)


# A Ctrl-C that comes while an extension module's C/C++ code initialises it is taken up at the first Python
# instruction after: importlib's, before the module is in sys.modules. Raised there, the new module was discarded,
# and onnx's nanobind module crashed the process when discarded (SIGSEGV or "terminate called after throwing an
# instance of 'nanobind::python_error'"). The signal is raised right after the module's C init returns.
AFTER_INIT = ("import signal, sys\n"
              "from importlib.machinery import ExtensionFileLoader\n"
              "target, create = sys.argv[1], ExtensionFileLoader.create_module\n"
              "def create_then_interrupt(self, spec):\n"
              "    module = create(self, spec)\n"
              "    if spec.name == target:\n"
              "        signal.raise_signal(signal.SIGINT)\n"
              "    return module\n"
              "ExtensionFileLoader.create_module = create_then_interrupt\n"
              "sys.argv = ['qconsist', *sys.argv[2:]]\n"
              "from qconsist.__main__ import main\n"
              "main()\n")


@pytest.mark.parametrize("module", ["onnx.onnx_cpp2py_export", "onnxruntime.capi.onnxruntime_pybind11_state",
                                    "numpy._core._multiarray_umath"])
def test_ctrl_c_while_an_extension_module_loads(tmp_path, module):
    """Ctrl-C during the C++ initialisation of onnx (nanobind), onnxruntime (pybind11) or numpy: the signal is kept
    until the module is in sys.modules, then it is the one line and 130 (on main onnx's crashed: exit -11)."""
    import importlib.util

    assert importlib.util.find_spec(module) is not None  # the module the signal waits for is there
    done = subprocess.run([sys.executable, "-c", AFTER_INIT, module, "env"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr, done.stdout) == (130, "error: interrupted\n", ""), (done.returncode, done.stderr)


# A Ctrl-C taken up inside a finalizer (here an object's ``__del__``, collected while the command line loads;
# importlib's module locks have a weakref callback that was hit so): Python prints it, "Exception ignored in", and
# loses it. The signal is raised inside the finalizer.
IN_A_FINALIZER = ("import signal, sys\n"
                  "from qconsist.__main__ import interrupt, main\n"
                  "interrupt.install()\n"
                  "class Finalized:\n"
                  "    def __del__(self):\n"
                  "        signal.raise_signal(signal.SIGINT)\n"
                  "        sum(range(10))\n"
                  "cycle = Finalized()\n"
                  "cycle.self = cycle\n"
                  "del cycle\n"
                  "sys.argv = ['qconsist', 'env']\n"
                  "main()\n")


def test_ctrl_c_inside_a_finalizer_is_not_lost(tmp_path):
    """The interrupt raised again once the finalizer is done: the one line and 130 (on main: 'Exception ignored
    in: <function Finalized.__del__ …>', its traceback, and `env`'s whole output with exit 0)."""
    done = subprocess.run([sys.executable, "-c", IN_A_FINALIZER], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr, done.stdout) == (130, "error: interrupted\n", ""), (done.returncode, done.stderr)


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
