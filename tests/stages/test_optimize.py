"""Stage optimize on the real open_nsfw conversion: ORT's tools, recorded parameters, checked outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qconsist.errors import ConfigError, FidelityError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inference.session import OptimizationLevel
from qconsist.stages.optimize import OptimizeMethod, OptimizeOptions, check_optimized, optimize_model

CAFFE = Preprocess.from_dict({"resize": [256, 256], "crop": [224, 224], "channel_order": "BGR", "mean": [104, 117, 123]})


@pytest.fixture(scope="module")
def evaluation():
    return open_input_set("package:photos", CAFFE, "data_input").subset(12, 4)


def _outputs(path, inputs):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, sample)[0] for sample in inputs])


def test_quant_pre_process_fuses_batchnorm_and_keeps_outputs(nsfw_run, evaluation, tmp_path):
    converted = nsfw_run.path / "convert" / "model.onnx"
    result = optimize_model(converted, tmp_path / "opt.onnx", OptimizeOptions(), evaluation)
    ops_before = {n.op_type for n in onnx.load(str(converted)).graph.node}
    ops_after = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert "BatchNormalization" in ops_before and "BatchNormalization" not in ops_after
    assert result.nodes_after < result.nodes_before
    assert result.params["tool"] == "onnxruntime.quantization.shape_inference.quant_pre_process"
    assert result.params["skip_symbolic_shape"] is True and result.params["atol"] == 1e-5
    # independent comparison of the two models' outputs on the same photographs
    expected = np.abs(_outputs(converted, evaluation) - _outputs(tmp_path / "opt.onnx", evaluation)).max()
    assert result.check.passed and result.check.samples == 4
    assert result.check.max_abs_diff == pytest.approx(float(expected), abs=1e-12)
    assert result.check.max_abs_diff <= 1e-5


def test_session_method_records_level_and_matches(nsfw_run, evaluation, tmp_path):
    converted = nsfw_run.path / "convert" / "model.onnx"
    options = OptimizeOptions(method=OptimizeMethod.SESSION, level=OptimizationLevel.EXTENDED)
    result = optimize_model(converted, tmp_path / "opt.onnx", options, evaluation)
    assert result.params["graph_optimization_level"] == "ORT_ENABLE_EXTENDED"
    assert result.nodes_after < result.nodes_before
    assert result.check.max_abs_diff <= 1e-5


def test_pipeline_records_the_optimize_check(nsfw_run):
    check = nsfw_run.checks["optimize"]["outputs_vs_convert"]
    assert check["passed"] is True and check["atol"] == 1e-5 and check["rtol"] == 1e-4
    assert check["samples"] == 9 and check["elements"] == 18
    assert float(check["max_abs_diff"]) <= 1e-5


def test_outputs_beyond_tolerance_raise_fidelity_error(nsfw_run, evaluation):
    # the quantized model really differs from the float one: as an "optimized" model it must be refused
    with pytest.raises(FidelityError, match=r"optimize changed the model's outputs beyond tolerance: output prob: Mismatched elements: \d+ / 8 "):
        check_optimized(nsfw_run.path / "optimize" / "model.onnx", nsfw_run.path / "quantize" / "model.onnx", evaluation, OptimizeOptions())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"atol": -1.0}, r"optimize.atol must be a number >= 0, got -1.0"),
        ({"level": OptimizationLevel.ALL}, r"optimize.level applies to method \"session\" only"),
        ({"method": OptimizeMethod.SESSION, "symbolic_shape": True}, r"apply to method quant_pre_process only"),
    ],
)
def test_invalid_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        OptimizeOptions(**kwargs)


def test_model_onnxruntime_cannot_run_is_refused(tmp_path):
    from onnx import TensorProto, helper

    from qconsist.errors import UnsupportedModelError

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 3)])
    model.ir_version = 3
    (tmp_path / "old.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(UnsupportedModelError, match=r"optimize: onnxruntime \S+ cannot load .*old.onnx: Could not find an implementation for Relu\(1\) node with name 'relu'$"):
        optimize_model(tmp_path / "old.onnx", tmp_path / "out.onnx", OptimizeOptions(method=OptimizeMethod.SESSION))
    assert not (tmp_path / "out.onnx").exists()
