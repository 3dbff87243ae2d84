"""--batch-size: steps of several samples, recorded per sample, comparable with a batch-1 run; fixed batch
dimensions refused in one line or re-stamped where the model allows it; calibration in batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from batch_models import baked_batch_model
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.errors import UnsupportedModelError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference.reader import load_dump
from qconsist.store.run import Run
from qconsist.inputs import open_input_set
from qconsist.store.rundir import open_run


def _run(model, arrays, tmp_path, run_id, level="all", **request):
    inputs = open_input_set(arrays, None, "x")
    options = ExecutionOptions(graph_optimization_level=level)
    return run_inference(resolve_model(model), inputs, RunRequest(options, dump=True, **request),
                         tmp_path / "runs", run_id=run_id)


def test_batches_are_recorded_per_sample_and_compare_with_batch_1(tmp_path):
    model = build_classifier_model(tmp_path / "m.onnx", "N")
    arrays = save_arrays(tmp_path / "x.npy", 10, seed=4)  # 10 = 4 + 4 + 2: the last step is smaller
    one = _run(model, arrays, tmp_path, "one")
    four = _run(model, arrays, tmp_path, "four", batch_size=4)
    assert four.samples == 10 and open_run(four.run_dir).sections["inference"]["batch_size"] == 4
    table = load_dump(Run.open(four.run_dir)).table
    assert table.shape[0] == 10
    index = open_run(four.run_dir).sections["dump"]
    assert index["faithful"] and index["samples_checked"] == 10
    result = diff_runs(one.run_dir, four.run_dir)
    assert result.tensors.samples == 10 and result.outputs.samples == 10
    # on the CPU this model computes every sample the same way at any batch size
    assert result.passed, [n.label for n in result.tensors.nodes]


def test_tensors_without_a_batch_axis_are_shared_by_the_rows_of_a_step(tmp_path):
    """A node computed from constants (here Relu of a 4-row initializer, in a batch of 4) is one tensor for
    the whole step: recorded once per sample, never split along its first axis."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Relu", ["c"], ["rc"], name="const_relu"),
             helper.make_node("Add", ["x", "rc"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 3])],
        [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path))
    np.save(tmp_path / "x.npy", rng.normal(size=(8, 4, 3)).astype(np.float32))
    four = _run(path, tmp_path / "x.npy", tmp_path, "four", batch_size=4, level="disable")
    one = _run(path, tmp_path / "x.npy", tmp_path, "one", level="disable")
    names = _tensors(four.run_dir)
    hashes = load_dump(Run.open(four.run_dir)).table.block(0, 8)["hash"]
    shared, per_sample = names.index("rc"), names.index("y")
    assert len(set(hashes[:, shared].tolist())) == 1  # the same 4x3 tensor for all 8 samples
    assert len(set(hashes[:, per_sample].tolist())) == 8
    assert diff_runs(one.run_dir, four.run_dir).passed


def _tensors(run_dir):
    import json

    return [t["name"] for t in json.loads((run_dir / "dump" / "index.json").read_text())["tensors"]]


def test_fixed_batch_is_refused_in_one_line(tmp_path, small_models):
    result = CliRunner().invoke(app, ["run", str(small_models["classifier"]), "--inputs", str(small_models["arrays"]),
                                      "--batch-size", "4"])
    assert result.exit_code == 2
    assert result.stderr == ("error: model input 'x' has a fixed batch dimension of 1; --batch-size 4 needs a dynamic "
                             "one: convert with [convert] dynamic_batch = true, or re-stamp the model with --dynamic-batch\n")


def test_dynamic_batch_restamps_and_records_it(tmp_path, small_models):
    result = CliRunner().invoke(app, ["run", str(small_models["classifier"]), "--inputs", str(small_models["arrays"]),
                                      "--batch-size", "4", "--dynamic-batch", "--dump", "--runs-dir", str(tmp_path / "runs"),
                                      "--run-id", "restamped", "--json"])
    assert result.exit_code == 0, result.output
    manifest = open_run(tmp_path / "runs" / "restamped")
    restamped = manifest.model["dynamic_batch"]
    assert restamped["path"] == "model/model.onnx" and len(restamped["sha256"]) == 64
    model = onnx.load(str(tmp_path / "runs" / "restamped" / "model" / "model.onnx"))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert manifest.model["artifact"]["sha256"] != restamped["sha256"]  # the original stays recorded as the model
    baseline = _run(small_models["classifier"], small_models["arrays"], tmp_path, "batch1")
    assert diff_runs(baseline.run_dir, tmp_path / "runs" / "restamped").top1_agreement == 1.0


def test_dynamic_batch_makes_one_session_of_the_runs_options(tmp_path, small_models, monkeypatch):
    """--dynamic-batch reads the model's outputs (a sequence output is refused before re-stamping) from a CPU
    session of the graph unoptimized, not from a second session of the run's own options (on the CUDA EP, a
    second CUDA session on the start-up's critical path): the run's options make production alone, the
    re-stamp check's two sessions run on the CPU with one thread."""
    from qconsist.inference import runner

    made, original = [], runner.create_session
    monkeypatch.setattr(runner, "create_session", lambda path, options, **kw: made.append(
        (Path(path).name, options, kw.get("level"))) or original(path, options, **kw))
    options = ExecutionOptions(graph_optimization_level="basic", intra_op_threads=2)
    inputs = open_input_set(small_models["arrays"], None, "x")
    run_inference(resolve_model(small_models["classifier"]), inputs, RunRequest(options, batch_size=4, dynamic_batch=True),
                  tmp_path / "runs", run_id="restamped")
    assert [o for _, o, _ in made].count(options) == 1
    # one session of the outputs, of the re-stamped model: it checks them (a sequence output refused as on the
    # original) and probes their batch axes; the check's two (original and re-stamped), production
    outputs = ("model.onnx", ExecutionOptions(intra_op_threads=1), "disable")
    check = ExecutionOptions(graph_optimization_level="basic", intra_op_threads=1)
    assert sorted(made, key=repr) == sorted([outputs, ("model.onnx", check, None), (small_models["classifier"].name, check, None),
                                             ("model.onnx", options, None)], key=repr)


def test_a_model_with_its_batch_baked_in_cannot_be_restamped(tmp_path, small_models):
    # Reshape to [1, 5 * 8] keeps the batch of one inside the graph
    path = baked_batch_model(tmp_path / "baked.onnx")
    with pytest.raises(UnsupportedModelError, match=r"baked.onnx cannot take another batch size \(dynamic_batch\): "):
        _run(path, small_models["arrays"], tmp_path, "baked", batch_size=2, dynamic_batch=True)
    assert not (tmp_path / "runs" / "baked").exists()


def test_calibration_in_batches_gives_the_same_minmax_model(tmp_path):
    from qconsist.stages.quantize import CalibrationOptions, quantize_model
    from qconsist.store.hashing import hash_file

    model = build_classifier_model(tmp_path / "m.onnx", "N")
    inputs = open_input_set(save_arrays(tmp_path / "x.npy", 12, seed=2), None, "x")
    one = quantize_model(model, tmp_path / "q1.onnx", inputs, calibration=CalibrationOptions())
    four = quantize_model(model, tmp_path / "q4.onnx", inputs, calibration=CalibrationOptions(batch_size=4))
    assert four.params["calibration"]["batch_size"] == 4 and "batch_size" not in one.params["calibration"]
    assert hash_file(tmp_path / "q1.onnx").md5 == hash_file(tmp_path / "q4.onnx").md5  # min and max of all samples
