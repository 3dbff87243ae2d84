"""Issue 15's hostile inputs, each through the CLI: its documented exit code and its exact one-line message,
nothing left behind (runs/, the system's temporary folder), nothing written that was only read."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image
from typer.testing import CliRunner

from hostile_files import png_header
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.store.rundir import list_runs


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _error(result, message: str, code: int = 2) -> None:
    """Exit ``code`` and exactly ``error: message`` on stderr, one line, no traceback."""
    assert result.exit_code == code, result.output
    assert result.stderr == f"error: {message}\n"
    assert "Traceback" not in result.output


def _nothing_left(runs: Path = Path("runs")) -> None:
    assert not runs.exists() or list(runs.iterdir()) == [], f"left behind: {list(runs.iterdir())}"


def _pipeline(folder: Path, model: Path, data: Path | str, extra: str = "", name: str = "p.toml") -> Path:
    path = folder / name
    path.write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "{data}"\n{extra}')
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The small classifier, its calibration arrays, and one complete pipeline run of it (with its QDQ model)."""
    folder = tmp_path_factory.mktemp("hostile")
    model = build_classifier_model(folder / "classifier.onnx")
    arrays = save_arrays(folder / "arrays.npy", 6, seed=2)
    runs = folder / "runs"
    result = CliRunner().invoke(app, ["pipeline", "run", str(_pipeline(folder, model, arrays)), "--runs-dir", str(runs),
                                      "--run-id", "good"])
    assert result.exit_code == 0, result.output
    return {"folder": folder, "model": model, "arrays": arrays, "run": runs / "good",
            "qdq": runs / "good" / "quantize" / "model.onnx"}


# --- crashes that exited 1 ----------------------------------------------------------------------------------


def test_quantized_model_as_pipeline_entry(made, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["qdq"], made["arrays"]))
    _error(result, f"{made['qdq']} is already quantized (16 DequantizeLinear, QuantizeLinear node(s)); "
                   "give the float model it was made from")
    _nothing_left()


def test_quantized_model_to_calib_repeat(made):
    result = _invoke("calib", "repeat", made["qdq"], "--inputs", made["arrays"])
    _error(result, f"{made['qdq']} is already quantized (16 DequantizeLinear, QuantizeLinear node(s)); "
                   "give the float model it was made from")


def test_calibration_table_of_a_twice_quantized_graph_terminates(made):
    """The downstream walk that recursed without end: a Q/DQ chain feeding back on itself."""
    from onnx import helper

    from qconsist.stages.calibration_table import _consumers, _downstream

    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["b"]), helper.make_node("DequantizeLinear", ["b", "s", "z"], ["a"]),
             helper.make_node("Relu", ["b"], ["c"], name="relu")]
    graph = helper.make_graph(nodes, "cycle", [], [])
    assert _downstream("a", _consumers(graph)) == ["relu"]


@pytest.mark.parametrize("side, words", [(20000, "has 400000000 pixels"), (10000, "has 100000000 pixels (10000x10000)")])
def test_image_above_the_pixel_limit(made, tmp_path, side, words):
    photos = tmp_path / "photos"
    photos.mkdir()
    image = png_header(photos / "huge.png", side, side)
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], photos, "[preprocess]\nresize = [8, 8]\n"))
    _error(result, f"image {image} {words}, above the limit of 50000000 (50 megapixels)")  # no PIL warning lines
    _nothing_left()


def test_all_nan_calibration_data(made, tmp_path):
    np.save(tmp_path / "nan.npy", np.full((3, 3, 8, 8), np.nan, np.float32))
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], tmp_path / "nan.npy"))
    _error(result, "sample 000000: input 'x' holds 192 NaN and 0 infinite value(s); every input must be finite")
    _nothing_left()


def test_nan_or_inf_in_one_sample_names_it(made, tmp_path):
    data = np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32)
    data[2, 0, 0, :2] = [np.inf, np.nan]
    np.save(tmp_path / "one.npy", data)
    message = "sample 000002: input 'x' holds 1 NaN and 1 infinite value(s); every input must be finite"
    _error(_invoke("pipeline", "run", _pipeline(tmp_path, made["model"], tmp_path / "one.npy")), message)
    _error(_invoke("run", made["model"], "--inputs", tmp_path / "one.npy"), message)
    _error(_invoke("calib", "repeat", made["model"], "--inputs", tmp_path / "one.npy"), message)
    _nothing_left()


def test_locate_fp16_on_a_run_takes_its_float_stage(made):
    result = _invoke("locate", made["run"], "--inputs", made["arrays"], "--precision", "fp16", "--ep", "cpu", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["model"]["stage"] == "optimize"
    assert report["fp16"]["samples"] == 6


def test_locate_fp16_of_a_quantized_model(made):
    result = _invoke("locate", made["run"], "--stage", "quantize", "--inputs", made["arrays"], "--precision", "fp16", "--ep", "cpu")
    _error(result, f"--precision fp16 converts a float model to float16; {made['qdq']} is quantized; give the float "
                   "model: --stage optimize")
    result = _invoke("locate", made["qdq"], "--inputs", made["arrays"], "--precision", "fp16", "--ep", "cpu")
    _error(result, f"--precision fp16 converts a float model to float16; {made['qdq']} is quantized; give the float model")
    _nothing_left()


def test_onnx_entry_with_external_data(made, tmp_path):
    model = onnx.load(str(made["model"]))
    onnx.save(model, str(tmp_path / "external.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="external.onnx.data", size_threshold=0)
    result = _invoke("pipeline", "run", _pipeline(tmp_path, tmp_path / "external.onnx", made["arrays"]))
    _error(result, f"{tmp_path / 'external.onnx'} keeps its weights in external data file(s) external.onnx.data; qconsist "
                   "needs a self-contained model: save it with onnx.save(model, path, save_as_external_data=False)")
    _nothing_left()


# --- silent wrong results ---------------------------------------------------------------------------------------


def test_unknown_op_types(made, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"], '[quantize]\nop_types = ["NoSuchOp", "Conv"]\n'))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: quantize.op_types: onnxruntime cannot quantize NoSuchOp in QDQ format "
                                    "(it quantizes Add, ArgMax, AveragePool, BatchNormalization, Clip, Concat, Conv, ")
    assert result.stderr.count("\n") == 1
    _nothing_left()


def test_nodes_to_exclude_not_in_the_model(made, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"], '[quantize]\nnodes_to_exclude = ["nonexistent", "conv"]\n'))
    _error(result, "quantize.nodes_to_exclude: the model to quantize has no node named nonexistent "
                   "(its nodes: conv, relu, gap, flatten, fc, softmax)")
    _nothing_left()


def test_quantize_that_quantized_nothing(made, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"], '[quantize]\nop_types = ["MatMul"]\n'))
    _error(result, "quantize_static quantized nothing: the model has no MatMul node (quantize.op_types; its operators: "
                   "Conv, Flatten, Gemm, GlobalAveragePool, Relu, Softmax)")
    _nothing_left()


def test_sixteen_bit_grayscale_is_scaled_not_clipped(made, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(photos / "a_gray16.png")
    Image.new("RGBA", (16, 16), (10, 20, 30, 0)).save(photos / "b_rgba.png")
    Image.new("CMYK", (16, 16), (0, 0, 0, 0)).save(photos / "c_cmyk.jpg")
    Image.new("RGB", (16, 16), (1, 2, 3)).save(photos / "d_rgb.png")
    assert Image.open(photos / "a_gray16.png").mode == "I;16"
    from qconsist.inputs.preprocess import read_image

    pixels = read_image(photos / "a_gray16.png")
    assert pixels.shape == (64, 64, 3) and pixels.max() == 255.0 and pixels.min() == 0.0
    assert abs(float(pixels.mean()) - 127.5) < 0.01  # was 254.6: clipped to almost white
    assert read_image(photos / "b_rgba.png")[0, 0].tolist() == [10.0, 20.0, 30.0]
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], photos, "[preprocess]\nresize = [8, 8]\n"), "--run-id", "modes")
    assert result.exit_code == 0, result.output
    inputs = json.loads(Path("runs/modes/manifest.json").read_text())["inputs"]["calibration"]
    assert inputs["conversions"] == {
        "a_gray16.png": "I;16: 16-bit grayscale scaled by 255/65535, replicated to 3 channels",
        "b_rgba.png": "RGBA: alpha dropped", "c_cmyk.jpg": "CMYK: converted to RGB by Pillow",
    }


def test_float_image_refused(made, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.ones((8, 8), np.float32), "F").save(photos / "float.tif")
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], photos, "[preprocess]\nresize = [8, 8]\n"))
    _error(result, f"image {photos / 'float.tif'} holds 32-bit float pixels (mode F); save such data as .npy instead")


def test_float64_arrays_cast_is_recorded(made, tmp_path):
    np.save(tmp_path / "f64.npy", np.random.default_rng(0).normal(size=(4, 3, 8, 8)))
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], tmp_path / "f64.npy"), "--run-id", "f64")
    assert result.exit_code == 0, result.output
    inputs = json.loads(Path("runs/f64/manifest.json").read_text())["inputs"]["calibration"]
    assert inputs["dtype"] == {"x": "float64"}
    assert inputs["cast"] == {"x": "float64 -> float32"}


def _numbers_only(value, where="") -> None:
    """Every number in a JSON document is a JSON number (no "inf"/"nan" strings)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "nonfinite":
                _numbers_only(item, f"{where}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _numbers_only(item, f"{where}/{index}")
    else:
        assert value not in ("inf", "-inf", "nan", "Infinity", "NaN"), where


def test_non_finite_difference_is_null_flagged_and_never_passes():
    from qconsist.compare import compare_outputs
    from qconsist.store.serde import dumps

    reference = [{"y": np.array([[1.0, 2.0]], np.float32)}]
    candidate = [{"y": np.array([[1.0, np.inf]], np.float32)}]
    comparison = compare_outputs(reference, candidate, atol=None, rtol=None)  # record only: no tolerance
    assert comparison.max_abs_diff == float("inf")
    assert not comparison.passed
    data = json.loads(dumps(comparison))
    assert data["max_abs_diff"] is None and data["passed"] is False
    assert data["nonfinite"]["/max_abs_diff"] == "inf"
    _numbers_only(data)


def test_pipeline_json_numbers_are_numbers(made, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"]), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    _numbers_only(data)
    assert isinstance(data["checks"]["quantize"]["outputs_vs_optimize"]["max_abs_diff"], float)


# --- reading never writes ---------------------------------------------------------------------------------------


def test_history_refuses_a_foreign_database_and_leaves_it_alone(tmp_path):
    other = tmp_path / "other_app.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes(x)")
    before = other.read_bytes()
    _error(_invoke("history", "X", "--db", other), f"{other} is not a qconsist history database (schema version 0, tables: "
                                                    "notes); give the file that qconsist nightly writes")
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "other_app.sqlite"]  # no -wal, no -shm
    text = tmp_path / "text.sqlite"
    text.write_text("not a database")
    _error(_invoke("history", "X", "--history", text), f"{text} is not a qconsist history database (not an SQLite file)")


def test_history_reads_a_read_only_database(tmp_path):
    from qconsist.history import History

    path = tmp_path / "history.sqlite"
    History(path).start_night("n1", "nightly.toml", {"python": "3.11"})
    path.chmod(0o444)
    before = path.read_bytes()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    _error(_invoke("history", "X", "--history", path), f"no nightly history for model 'X' in {path}; models: none yet")
    assert path.read_bytes() == before


def test_report_and_gate_never_overwrite_a_run(made):
    manifest = made["run"] / "manifest.json"
    before = manifest.read_bytes()
    _error(_invoke("report", made["run"], "-o", manifest),
           f"output {manifest} would write inside the input {made['run'].resolve()}; choose another file (or --force)")
    _error(_invoke("gate", made["run"], "--junit", manifest),
           f"output {manifest} would write inside the input {made['run'].resolve()}; choose another file (or --force)")
    assert manifest.read_bytes() == before
    result = _invoke("report", made["run"], "-o", "report.html")
    assert result.exit_code == 0 and Path("report.html").is_file()


def test_outputs_create_no_folders(made, tmp_path):
    target = tmp_path / "nonexistent" / "dir" / "j.xml"
    _error(_invoke("gate", made["run"], "--junit", target),
           f"cannot write {target}: folder {target.parent} does not exist (qconsist creates no folder for it)")
    assert not (tmp_path / "nonexistent").exists()


def test_output_over_an_input_needs_force(made, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    _error(_invoke("gate", made["run"], "--policy", policy, "--markdown", policy),
           f"output {policy} would overwrite the input {policy}; choose another file (or --force)")
    assert policy.read_text() == ""
    result = _invoke("gate", made["run"], "--policy", policy, "--markdown", policy, "--force")
    assert result.exit_code in (0, 1) and policy.read_text().startswith("#")


def test_files_respect_the_umask(made, tmp_path):
    old = os.umask(0o027)
    try:
        assert _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"]), "--run-id", "masked").exit_code == 0
        assert _invoke("run", Path("runs/masked"), "--inputs", made["arrays"], "--run-id", "inference", "--dump", "--raw",
                       "all").exit_code == 0  # every kind of file a run writes: .npy tables and outputs, .npz raw tensors
    finally:
        os.umask(old)
    files = [p for p in Path("runs").rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".json", ".onnx", ".npz", ".npy"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o640"}, [(p, oct(p.stat().st_mode)) for p in files]


def test_temporary_files_live_in_the_run_and_go(made, tmp_path):
    from qconsist.store.rundir import RunDirectory
    from qconsist.store.scratch import scratch_dir

    with RunDirectory.create(tmp_path / "runs", "t", "test") as run:
        with scratch_dir("qconsist-quantize-") as folder:
            assert folder.parent == run.path / ".scratch"
            (folder / "big.onnx").write_bytes(b"x")
    assert not (run.path / ".scratch").exists()
    with pytest.raises(RuntimeError):
        with RunDirectory.create(tmp_path / "runs", "t", "test", "failing") as run:
            with scratch_dir("qconsist-quantize-"):
                raise RuntimeError("a bug")
    assert not (tmp_path / "runs" / "failing").exists()  # an internal error removes the run too


def test_internal_error_removes_the_run(made, tmp_path, monkeypatch):
    import qconsist.stages.quantize as quantize

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(quantize, "calibrate", broken)
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"]))
    assert result.exit_code == 4
    assert re.fullmatch(r"internal error: ZeroDivisionError: a bug \(at test_hostile_input\.py:\d+\) — rerun with -v for the traceback\n",
                        result.stderr)
    _nothing_left()


def test_sigterm_cleans_up_and_exits_130(made, tmp_path):
    """A killed CI job: the run stays incomplete (RUNNING.json), its scratch folder and every temporary file go."""
    many = tmp_path / "many.npy"
    np.save(many, np.random.default_rng(0).normal(size=(60000, 3, 8, 8)).astype(np.float32))
    pipeline = _pipeline(tmp_path, made["model"], many, f'[evaluation]\ndata = "{made["arrays"]}"\n')
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(system_tmp)}
    qconsist = Path(sys.executable).parent / "qconsist"  # the installed entry point, as a CI job runs it
    process = subprocess.Popen([str(qconsist), "pipeline", "run", str(pipeline), "--run-id", "killed"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    scratch = Path("runs/killed/.scratch")
    for _ in range(1200):
        if any(scratch.glob("qconsist-quantize-*/augmented.onnx")) or process.poll() is not None:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the pipeline finished before it could be signalled"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr.splitlines()[-1] == "error: interrupted"
    assert not scratch.exists()
    assert (Path("runs/killed") / "RUNNING.json").is_file()
    assert [p.name for p in system_tmp.iterdir() if p.name.startswith("qconsist")] == []
    assert [state for _, state in list_runs(Path("runs"))] == ["incomplete"]



def test_gate_drift_with_a_non_finite_difference_fails_even_without_a_limit():
    from qconsist.compare import compare_outputs
    from qconsist.gate.checks import _drift_result
    from qconsist.gate.policy import DriftLimits
    from qconsist.gate.verdict import CheckStatus

    comparison = compare_outputs([{"y": np.array([[0.2, 0.8]], np.float32)}], [{"y": np.array([[np.nan, 0.8]], np.float32)}], None, None)
    result = _drift_result("drift.float", "the float model", comparison, DriftLimits(max_abs_diff=None, min_top1_agreement=None))
    assert result.status is CheckStatus.FAIL
    assert result.message.startswith("against the float model: a non-finite difference (NaN or Inf on one side only); "
                                     "greatest absolute difference inf at y[0, 0] of sample 0")


def test_model_computing_nan_from_finite_inputs(made, tmp_path):
    """Finite calibration data, but Sqrt of negative values: ORT's calibrator would give a NaN range and assert."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(1).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Sqrt", ["x"], ["s"], name="sqrt"), helper.make_node("Conv", ["s", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "nan.onnx"))
    result = _invoke("pipeline", "run", _pipeline(tmp_path, tmp_path / "nan.onnx", made["arrays"]))
    _error(result, f"calibration measured a NaN range for tensor(s) y: the model computes NaN from the calibration inputs "
                   f"({made['arrays']}), so no scale can be chosen")
    _nothing_left()


# --- issue 19: bad input is exit 2 and one line --------------------------------------------------------------

QCONSIST = Path(sys.executable).parent / "qconsist"  # the installed entry point: descriptor 2 is real there


def _empty_graph(path: Path) -> Path:
    from onnx import helper

    graph = helper.make_graph([], "empty", [], [])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_empty_graph_is_one_line_without_onnxruntimes_log(made, tmp_path):
    """onnxruntime printed its multi-line C++ log ("[E:onnxruntime:, inference_session.cc…] Exception during
    initialization: …SaveInitializedTensors(…)") before the error, on the process's real stderr."""
    model = _empty_graph(tmp_path / "empty.onnx")
    pipeline = _pipeline(tmp_path, model, made["arrays"])
    for args, shown in ((["run", model, "--inputs", made["arrays"]], model),
                        (["pipeline", "run", pipeline, "--runs-dir", tmp_path / "runs"], model)):
        done = subprocess.run([str(QCONSIST), *map(str, args)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"error: {shown} has an empty graph: it declares no output, so there is nothing to run\n"
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def _big_classifier(path: Path) -> Path:
    """A classifier of 156 kB (two convolutions of 64 channels): big enough to fill a small disk mid-stage."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, .1, shape).astype(np.float32), name)
               for name, shape in (("w1", (64, 3, 3, 3)), ("w2", (64, 64, 3, 3)), ("fc", (5, 64)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["l"], name="fc", transB=1),
             helper.make_node("Softmax", ["l"], ["prob"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 5])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _on_a_small_disk(size: str, mount: Path, *command: str) -> subprocess.CompletedProcess:
    """``command`` with a tmpfs of ``size`` mounted at ``mount`` (a private mount namespace: nothing is mounted
    for anyone else, nothing to unmount)."""
    import shutil as _shutil

    if _shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a small tmpfs")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mount}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs in a user namespace: {probe.stderr.decode().strip()}")
    script = f'mount -t tmpfs -o size={size} tmpfs "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(mount), *command], capture_output=True,
                          text=True, timeout=300)


def test_full_disk_while_onnxruntime_writes_blames_the_write(made, tmp_path):
    """It read "cannot load …/model.onnx: Protobuf serialization failed", blaming the input model."""
    mount = tmp_path / "disk"
    mount.mkdir()
    model = _big_classifier(tmp_path / "big.onnx")
    pipeline = _pipeline(tmp_path, model, made["arrays"], '[optimize]\nmethod = "session"\n')
    done = _on_a_small_disk("240k", mount, str(QCONSIST), "pipeline", "run", str(pipeline), "--runs-dir", str(mount / "runs"),
                            "--run-id", "full")
    assert done.returncode == 2, done.stderr
    scratch = re.escape(str(mount / "runs" / "full" / ".scratch")) + r"/qconsist-optimize-\w+"
    assert re.fullmatch(rf"error: cannot write onnxruntime's optimized graph to {scratch}/model\.onnx: the disk is full "
                        rf"\(\d+ bytes free in {scratch}; onnxruntime said: Protobuf serialization failed\.\)\n", done.stderr), done.stderr


def test_full_disk_under_a_tool_that_writes_without_a_name(made, monkeypatch):
    """onnx.save inside onnxruntime's calibrator failing for want of space: an OSError without a file name, which
    exited 4 ("internal error: OSError: [Errno 28] No space left on device")."""
    import errno as _errno

    import onnx as _onnx

    real = _onnx._save_bytes

    def full(content, f):
        if str(f).endswith("augmented.onnx"):
            raise OSError(_errno.ENOSPC, "No space left on device")
        return real(content, f)

    monkeypatch.setattr(_onnx, "_save_bytes", full)
    result = _invoke("calib", "repeat", made["model"], "--inputs", made["arrays"])
    assert result.exit_code == 2, result.output
    folder = re.escape(tempfile.gettempdir())  # no run directory: the system's temporary folder holds the scratch
    assert re.fullmatch(rf"error: cannot write in {folder}/qconsist-quantize-\w+: No space left on device "
                        r"\(the disk holding it is full\)\n", result.stderr), result.stderr


def test_a_run_that_fails_on_a_full_disk_says_the_disk_is_full(made, tmp_path, monkeypatch):
    """Whatever a tool makes of a full disk (quantize_static read back a model it could not write and said "Failed
    to find proper ai.onnx domain"), the run says the disk is full, with what failed."""
    import errno as _errno
    import os as _os

    import qconsist.stages.quantize as quantize

    def broken(*args, **kwargs):
        from qconsist.errors import UnsupportedModelError

        raise UnsupportedModelError("quantize_static cannot quantize x.onnx: Failed to find proper ai.onnx domain")

    def no_space(fd, offset, length):
        raise OSError(_errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(quantize, "calibrate", broken)
    monkeypatch.setattr(_os, "posix_fallocate", no_space)  # the disk check's 64 KiB reservation fails
    result = _invoke("pipeline", "run", _pipeline(tmp_path, made["model"], made["arrays"]), "--run-id", "full")
    assert result.exit_code == 2
    assert re.fullmatch(r"error: cannot write in runs/full: the disk is full \(\d+ bytes free there\); what failed: "
                        r"quantize_static cannot quantize x\.onnx: Failed to find proper ai\.onnx domain\n", result.stderr), result.stderr
    _nothing_left()


@pytest.mark.parametrize("name, problem", [
    ("../../escape", "is a path that leads out of the runs directory"),
    ("nested/name", "is a path that would nest its runs in a folder"),
])
def test_pipeline_name_that_leaves_the_runs_directory(made, tmp_path, name, problem):
    """"../../escape" was refused as "invalid run id '..-..-escape-…': use letters, digits, '.', '_' and '-'", which
    it does."""
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'name = "{name}"\n[model]\nonnx = "{made["model"]}"\n[calibration]\ndata = "{made["arrays"]}"\n')
    _error(_invoke("pipeline", "run", pipeline),
           f"{pipeline}: name '{name}' {problem}; the name labels the run directories (<runs_dir>/<name>-<time>-<random>): "
           "give a plain name, without '/' or '\\'")
    _nothing_left()


@pytest.mark.parametrize("run_id, problem", [
    ("..", "it names the runs directory's parent, not a folder inside it; a run id starts with a letter or digit"),
    (".hidden", "it starts with '.'; a run id starts with a letter or digit"),
])
def test_run_id_of_allowed_characters_says_what_is_wrong(made, run_id, problem):
    _error(_invoke("run", made["model"], "--inputs", made["arrays"], "--run-id", run_id), f"invalid run id '{run_id}': {problem}")
    _nothing_left()


def test_diff_of_a_run_with_itself_says_so(made):
    result = _invoke("diff", made["run"], made["run"])
    assert result.exit_code == 0
    assert result.stdout.count("same run") == 1
    assert ("note: A and B are the same run (good): a run compared with itself is identical by construction; compare "
            "two runs to learn something\n") in result.stdout
    data = json.loads(_invoke("diff", made["run"], made["run"], "--json").stdout)
    assert data["same_run"] is True


def test_gate_with_itself_as_baseline_fails_saying_so(made):
    result = _invoke("gate", made["run"], "--baseline", made["run"])
    assert result.exit_code == 1
    assert ("  FAIL           baseline: the baseline is the candidate's own run (good): a run compared with itself passes "
            "every baseline check by construction; give the previous release's run as --baseline, or none for a first "
            "release\n") in result.stdout
    data = json.loads(_invoke("gate", made["run"], "--baseline", made["run"], "--json").stdout)
    assert data["same_run"] is True and data["passed"] is False
    assert data["reasons"][0].startswith("baseline: the baseline is the candidate's own run (good)")


def test_output_that_is_also_an_input_is_one_line(made, tmp_path):
    """quantize_static asserted ("Graph is not a DAG"): exit 4, "internal error: AssertionError"."""
    model = onnx.load(str(made["model"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8]))
    onnx.save(model, str(tmp_path / "passthrough.onnx"))
    result = _invoke("pipeline", "run", _pipeline(tmp_path, tmp_path / "passthrough.onnx", made["arrays"]), "--run-id", "pass")
    _error(result, "quantize_static cannot quantize runs/pass/optimize/model.onnx: its output(s) x are also its input(s) "
                   "(passed through unchanged), which onnxruntime's quantizer turns into a cycle (Graph is not a DAG); "
                   "leave such an output out of the model")
    _nothing_left()
