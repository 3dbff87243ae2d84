"""A dump of float16 tensors: the compiled kernels read no float16, numpy computes their statistics.

On onnxruntime 1.32.0 ONNX's float16 attention node tests ran (1.31.1 refused them) and every one ended in exit 4:
the dump's start-up (``kernels.prepare``) called the compiled NaN/Inf reader with a float16 array, which numba
cannot type. A model built here (Cast to float16, Relu, larger than ``kernels.SMALL``) shows it on any version."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from qconsist.diff import diff_runs
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference.kernels import SMALL
from qconsist.inference.reader import load_dump
from qconsist.inputs import open_input_set
from qconsist.store.run import Run


def _float16_model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 3, 64, 64])
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="cast"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(nodes, "f16", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_dump_of_float16_tensors_is_recorded_and_faithful(tmp_path):
    model = _float16_model(tmp_path / "f16.onnx")
    x = np.random.default_rng(16).normal(size=(3, 3, 64, 64)).astype(np.float32)
    x[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 65504.0 * 2]  # NaN and Inf (and an overflow to Inf) in float16
    np.save(tmp_path / "x.npy", x)
    assert 3 * 64 * 64 > SMALL  # the compiled kernels' side of the statistics, not numpy's small-tensor path
    runs = []
    for name in ("a", "b"):
        request = RunRequest(ExecutionOptions(graph_optimization_level="all"), dump=True)
        runs.append(run_inference(resolve_model(model), open_input_set(tmp_path / "x.npy", None, "x"), request,
                                  tmp_path / "runs", run_id=name))
    run = Run.open(runs[0].run_dir)
    assert run.dump.faithful
    dump = load_dump(run)
    assert dump.samples == 3 and {dump.dtype(0, c) for c in range(len(dump.tensors))} == {"float32", "float16"}  # x; h and y
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    stored = np.load(runs[0].run_dir / "outputs" / "o0.npy")
    for i in range(3):
        np.testing.assert_array_equal(stored[i], session.run(None, {"x": x[i:i + 1]})[0])
    assert diff_runs(runs[0].run_dir, runs[1].run_dir).passed
