"""``[convert] dynamic_batch`` on an ONNX entry whose batch is fixed (issue 27 item 10): re-stamped to take any
batch, checked numerically like every stage (a step of its fixed batch through the entry against each sample
alone through the re-stamped model); a graph that bakes its batch in is refused."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from batch_models import fixed_batch_model
from qconsist.errors import UnsupportedModelError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline


def _pipeline(model, arrays, tmp_path):
    return parse_pipeline({"model": {"onnx": str(model)}, "convert": {"dynamic_batch": True},
                           "calibration": {"data": str(arrays)}}, tmp_path / "p.toml")


def test_a_batch_fixed_at_10_is_made_dynamic_and_checked(tmp_path):
    model = fixed_batch_model(tmp_path / "fixed10.onnx")
    x = np.random.default_rng(6).normal(size=(12, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = run_pipeline(_pipeline(model, tmp_path / "x.npy", tmp_path), runs_dir=tmp_path / "runs", run_id="dyn")
    convert = json.loads((result.path / "manifest.json").read_text())["stages"][0]
    assert convert["params"]["dynamic_batch"] == {"fixed_batch": 10, "inputs": ["x"]}
    check = convert["checks"]["dynamic_batch_vs_entry"]
    assert check["passed"] and check["samples"] == 10
    converted = onnx.load(str(result.path / "convert" / "model.onnx"))
    assert converted.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # the converted model runs one sample as the entry ran it in its step of 10
    entry = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x[:10]})[0]
    alone = ort.InferenceSession(str(result.path / "convert" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(alone.run(None, {"x": x[3:4]})[0], entry[3:4], rtol=1e-5, atol=1e-6)
    # and a run of it at batch 4 records what batch 1 records
    inputs = open_input_set(tmp_path / "x.npy", None, "x")
    runs = [run_inference(resolve_model(result.path / "convert" / "model.onnx"), inputs,
                          RunRequest(ExecutionOptions(), batch_size=b), tmp_path / "runs", run_id=f"b{b}") for b in (1, 4)]
    np.testing.assert_array_equal(np.load(runs[0].run_dir / "outputs" / "o0.npy"), np.load(runs[1].run_dir / "outputs" / "o0.npy"))


def test_a_batch_baked_into_the_graph_is_refused(tmp_path):
    """A Reshape to [10, 192]: the re-stamped model cannot run one sample."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "baked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 192])],
                              [numpy_helper.from_array(np.array([10, 192], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "baked.onnx"))
    np.save(tmp_path / "x.npy", np.zeros((12, 3, 8, 8), np.float32))
    with pytest.raises(UnsupportedModelError, match=r"^convert.dynamic_batch: .*baked.onnx does not run on one sample "
                                                    r"once its batch of 10 is dynamic: "):
        run_pipeline(_pipeline(tmp_path / "baked.onnx", tmp_path / "x.npy", tmp_path), runs_dir=tmp_path / "runs", run_id="baked")
