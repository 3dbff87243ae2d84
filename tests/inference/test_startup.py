"""`qconsist run`'s start-up: its phases logged under -v in one line, and the parts done beside production's session
(the inputs opened, the re-stamp checked, the dump planned) failing with the run's one line and exit code, in the
order they had one after the other, leaving no run directory behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from typer.testing import CliRunner

from batch_models import baked_batch_model
from qconsist.cli import app

QCONSIST = Path(sys.executable).parent / "qconsist"  # a real process: the start-up counts from its start
LINE = re.compile(r"qconsist\.inference\.runner: start-up: (\d+\.\d\d) s from the process's start to the first step "
                  r"\((\d+\.\d\d) s of it from run_inference's start\): (.*?); beside: (.*)$")


def _phases(text: str) -> dict[str, float]:
    phases = {}
    for item in text.split(", "):
        name, seconds, unit = item.rsplit(" ", 2)
        assert unit == "s", item
        phases[name] = float(seconds)
    return phases


def test_the_start_up_is_logged_phase_by_phase_in_one_line(tmp_path, small_models):
    done = subprocess.run([str(QCONSIST), "-v", "run", str(small_models["classifier"]), "--inputs",
                           str(small_models["arrays"]), "--batch-size", "4", "--dynamic-batch", "--dump", "--runs-dir",
                           str(tmp_path / "runs"), "--run-id", "phases"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = [m for m in map(LINE.search, done.stderr.splitlines()) if m]
    assert len(found) == 1, done.stderr
    total, library = float(found[0].group(1)), float(found[0].group(2))
    main, beside = _phases(found[0].group(3)), _phases(found[0].group(4))
    # the main thread's phases follow each other from the process's start: they add up to the total
    assert {"process", "imports", "model", "run directory and workers", "model read", "re-stamp", "session",
            "production checks", "recorder", "writer", "progress", "first inputs"} <= set(main)
    assert abs(sum(main.values()) - total) <= 0.005 * len(main) + 0.011
    assert 0 < library < total and main["process"] > 0
    # what ran beside production's session, each part timed in its thread
    assert {"inputs", "model md5", "outputs session", "re-stamp sample", "re-stamp md5", "re-stamp check of the original",
            "re-stamp check", "output probe", "dump plan", "accuracy target"} <= set(beside)
    assert all(seconds >= 0 for seconds in [*main.values(), *beside.values()])
    assert beside["re-stamp check"] > 0 and beside["dump plan"] > 0 and main["session"] > 0


def test_an_input_error_opened_beside_the_session_is_the_runs_first(tmp_path, small_models):
    """The input folder is listed in a thread while production's session is made: an empty folder is still the run's
    one line and exit 2, before the run directory's own error (its run id taken) and the model's; nothing is left."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "kept.txt").write_text("mine")
    unloadable = tmp_path / "unknown_op.onnx"  # onnxruntime cannot make its session
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="qconsist.test")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("qconsist.test", 1)])
    model.ir_version = 8
    onnx.save(model, str(unloadable))
    runner = CliRunner()
    for model_path, run_id in ((small_models["classifier"], "taken"), (unloadable, "fresh")):
        result = runner.invoke(app, ["run", str(model_path), "--inputs", str(tmp_path / "empty"), "--runs-dir",
                                     str(tmp_path / "runs"), "--run-id", run_id])
        assert result.exit_code == 2, result.output
        assert result.stderr == (f"error: input folder {tmp_path / 'empty'} holds no images (.bmp, .gif, .jpeg, .jpg, "
                                 ".png, .tif, .tiff, .webp) no .npy and no .npz files\n")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["taken"]
    assert [p.name for p in (tmp_path / "runs" / "taken").iterdir()] == ["kept.txt"]


def test_the_restamp_checks_error_beside_the_session_is_the_runs_and_leaves_nothing(tmp_path, small_models):
    """The re-stamp's check runs in threads beside production's session, the outputs' probe and the dump's plan: a
    model with its batch baked in still fails with the check's line (not the probe's, not the plan's), exit 2, and
    the parts that write in the run directory (the plan) are waited for before it is removed."""
    path = baked_batch_model(tmp_path / "baked.onnx")
    result = CliRunner().invoke(app, ["run", str(path), "--inputs", str(small_models["arrays"]), "--batch-size", "2",
                                      "--dynamic-batch", "--dump", "--runs-dir", str(tmp_path / "runs"), "--run-id", "baked"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: {path} cannot take another batch size (--dynamic-batch): ")
    assert list((tmp_path / "runs").iterdir()) == []
