"""quant-error on small models built in code, quantized by the pipeline in both formats: QDQ (ORT fuses it into
QLinearConv, QGemm, … at level all) and QOperator (integer kernels in the model itself, the Relu folded into the
QLinearConv). Both quantize the same tensors with the same ranges, so the matched tensors must agree."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.quantization.qdq_loss_debug import (
    compute_signal_to_quantization_noice_ratio,
    compute_weight_error,
    create_weight_matching,
)

from onnx_builders import build_classifier_model, save_arrays
from qconsist.diff.quantization import quantization_error
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("formats")
    model, arrays = build_classifier_model(folder / "classifier.onnx"), save_arrays(folder / "arrays.npy", 12, seed=2)
    out = {}
    for fmt in ("QDQ", "QOperator"):
        config = parse_pipeline({"name": "classifier", "model": {"onnx": str(model)}, "calibration": {"data": str(arrays)},
                                 "quantize": {"format": fmt}}, folder / "pipeline.toml")
        run = run_pipeline(config, runs_dir=folder / "runs", run_id=fmt).path
        out[fmt] = (run, quantization_error(run, open_input_set(arrays, None, "x")))
    out["inputs"] = open_input_set(arrays, None, "x")
    return out


def test_both_formats_match_the_same_tensors_with_the_same_error(formats):
    (_, qdq), (_, qop) = formats["QDQ"], formats["QOperator"]
    assert qdq.faithful and qop.faithful and qdq.samples == qop.samples == 12
    by_qdq, by_qop = {e.tensor: e for e in qdq.tensors}, {e.tensor: e for e in qop.tensors}
    assert set(by_qdq) == {"relu", "gap", "flat", "logits"}
    assert set(by_qop) == {"x", "relu", "gap", "flat", "logits"}  # QOperator: the input's quantization is a tensor of the model
    assert by_qdq["relu"].how == by_qop["relu"].how == "dequantized, NHWC"  # the QLinearConv output, channels last
    assert by_qop["relu"].observed == "conv_quant"  # QOperator folds the Relu: its conv output holds the Relu's value
    for name in by_qdq:
        assert by_qdq[name].sqnr_db == pytest.approx(by_qop[name].sqnr_db, abs=1e-6), name
        assert by_qdq[name].max_abs == pytest.approx(by_qop[name].max_abs, abs=1e-6), name
    assert by_qdq["relu"].sqnr_db < by_qdq["gap"].sqnr_db  # averaging removes quantization noise


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_final_output_error_matches_production_sessions(formats, fmt):
    run, result = formats[fmt]
    inputs = formats["inputs"]
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    float_session = ort.InferenceSession(str(run / "optimize" / "model.onnx"), plain, providers=["CPUExecutionProvider"])
    quantized_session = ort.InferenceSession(str(run / "quantize" / "model.onnx"), providers=["CPUExecutionProvider"])
    floats = [float_session.run(None, inputs.sample(i))[0] for i in range(len(inputs))]
    quantized = [quantized_session.run(None, inputs.sample(i))[0] for i in range(len(inputs))]
    (prob,) = result.outputs
    assert prob.tensor == "prob" and prob.elements == 5
    assert prob.sqnr_db == pytest.approx(compute_signal_to_quantization_noice_ratio(floats, quantized), abs=1e-4)
    assert prob.max_abs == max(float(np.abs(a - b).max()) for a, b in zip(floats, quantized))


def test_weights_of_the_qdq_model_match_onnxruntime(formats):
    run, result = formats["QDQ"]
    matching = create_weight_matching(str(run / "optimize" / "model.onnx"), str(run / "quantize" / "model.onnx"))
    theirs = compute_weight_error(matching)
    ours = {w.tensor: w.sqnr_db for w in result.weights}
    assert set(ours) == set(theirs) == {"conv_w", "conv_b", "fc_w", "fc_b"}
    for name in ours:
        # an int32 bias: onnxruntime's helper dequantizes in float64, DequantizeLinear (and qconsist) in float32
        wide = matching[name]["dequantized"].dtype == np.float64
        assert ours[name] == pytest.approx(theirs[name], abs=1e-2 if wide else 1e-4), name
    assert formats["QOperator"][1].weights == []  # QOperator kernels read their integer weights directly
