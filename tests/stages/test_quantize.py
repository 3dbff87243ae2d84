"""Stage quantize: quantize_static behind typed options, the calibration table, scale validation, checks."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qconsist.errors import ConfigError, FidelityError, InputError, UnavailableError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inference.session import ExecutionOptions
from qconsist.stages.quantize import (
    CalibrationMethodChoice, CalibrationOptions, QuantFormatChoice, QuantizeOptions, QuantTypeChoice,
    check_quantized, quantize_model,
)

CAFFE = Preprocess.from_dict({"resize": [256, 256], "crop": [224, 224], "channel_order": "BGR", "mean": [104, 117, 123]})


def _manifest(nsfw_run):
    from qconsist.store.rundir import open_run

    return open_run(nsfw_run.path)


def test_activation_scales_follow_the_calibrated_ranges(nsfw_run):
    """int8 asymmetric: scale = (max(rmax,0) - min(rmin,0)) / 255, zero point = round(-128 - rmin / scale)."""
    table = _manifest(nsfw_run).calibration["table"]
    activations = {name: e for name, e in table.items() if e["kind"] == "activation"}
    assert len(activations) > 50 and "data_input" in activations and "relu_1" in activations
    # ORT quantizes a Softmax output over [0, 1] whatever the calibrated range
    assert activations.pop("prob")["scale"] == pytest.approx(float(np.float32(1 / 255)), rel=1e-7)
    for name, entry in activations.items():
        low, high = min(entry["min"], 0.0), max(entry["max"], 0.0)
        scale = np.float32((high - low) / 255.0)
        assert entry["scale"] == pytest.approx(float(scale), rel=1e-6), name
        assert entry["zero_point"] == int(np.round(-128 - low / scale)), name
    # the Caffe mean-subtracted BGR photographs span about -123..151
    assert activations["data_input"]["min"] == pytest.approx(-123.0) and activations["data_input"]["max"] <= 152
    assert activations["relu_1"]["nodes"] == ["pool1"]


def test_per_channel_weight_scales_match_the_float_weights(nsfw_run):
    """int8 symmetric per channel: scale[c] = max |W[c]| / 127, computed here from the optimized model,
    except where ORT raises it so that the int32 bias scale (input scale × weight scale) can hold the bias:
    scale[c] >= 1.0001 × 2|b[c]| / (2^32 - 2) / input scale."""
    table = _manifest(nsfw_run).calibration["table"]
    optimized = onnx.load(str(nsfw_run.path / "optimize/model.onnx")).graph
    floats = {t.name: numpy_helper.to_array(t) for t in optimized.initializer}
    convs = {n.name: n for n in optimized.node if n.op_type == "Conv"}
    weights = {name: e for name, e in table.items() if e["kind"] == "weight" and e["nodes"][0] in convs}
    assert len(weights) >= 50
    raised = 0
    for name, entry in weights.items():
        conv = convs[entry["nodes"][0]]
        w, bias = floats[conv.input[1]], floats[conv.input[2]]
        assert name == conv.input[1]
        input_scale = np.float64(table[conv.input[0]]["scale"])
        plain = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float64) / 127.0
        bias_floor = 1.0001 * 2.0 * np.abs(bias.astype(np.float64)) / (2.0**32 - 2) / input_scale
        expected = np.where(input_scale * plain < bias_floor * input_scale, bias_floor, plain)
        raised += int(np.count_nonzero(expected != plain))
        assert len(entry["scale"]) == w.shape[0], name
        np.testing.assert_allclose(entry["scale"], expected, rtol=1e-5, err_msg=name)
        assert set(entry["zero_point"]) == {0}
    assert raised > 0  # open_nsfw has dead channels (|W| ~ 1e-13) whose scale ORT raises
    conv_1 = next(e for e in weights.values() if e["nodes"] == ["conv_1"])
    assert conv_1["quant_type"] == "int8" and conv_1["data_initializer"].endswith("_quantized")


def test_quantized_vs_float_is_recorded(nsfw_run):
    check = nsfw_run.checks["quantize"]["outputs_vs_optimize"]
    assert check["samples"] == 9 and check["atol"] is None
    assert 0 < float(check["max_abs_diff"]) < 0.05
    assert check["top1_agreement"] == 1.0
    assert nsfw_run.checks["quantize"]["invalid_scales"] == []


def test_gates_fail_with_stated_tolerance(nsfw_run):
    evaluation = open_input_set("package:photos", CAFFE, "data_input").subset(12, 3)
    source, quantized = nsfw_run.path / "optimize/model.onnx", nsfw_run.path / "quantize/model.onnx"
    with pytest.raises(FidelityError, match=r"differs from the float model by up to 0\.0\d+ \(output prob, sample \d\), above quantize.max_abs_diff 1e-06"):
        check_quantized(source, quantized, evaluation, QuantizeOptions(max_abs_diff=1e-6))
    assert check_quantized(source, quantized, evaluation, QuantizeOptions(min_top1_agreement=1.0)).top1_agreement == 1.0


def test_infinite_pad_constant_is_reported_with_tensor_and_node(small_models, tmp_path):
    inputs = open_input_set(small_models["arrays"])
    with pytest.raises(FidelityError, match=r"tensor 'pad_value' \(consumed by pad\) has an infinite scale in 'pad_value_scale' \(1 value\(s\)\) \(and 2 more\)"):
        quantize_model(small_models["pad_pool"], tmp_path / "q.onnx", inputs)
    result = quantize_model(small_models["pad_pool"], tmp_path / "q.onnx", inputs, QuantizeOptions(allow_invalid_scales=True))
    found = {(i.tensor, i.problem): i.nodes for i in result.issues}
    assert found[("pad_value", "inf")] == ("pad",)
    assert found[("padded", "inf")] == ("pool",)
    scales = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "q.onnx")).graph.initializer}
    assert np.isinf(scales["pad_value_scale"]) and np.isinf(scales["padded_scale"])
    assert result.table.entries["padded"].range_min == float("-inf")


def test_finite_pad_constant_has_no_issue(small_models, tmp_path):
    result = quantize_model(small_models["pad_pool_zero"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]))
    assert result.issues == []
    assert result.table.entries["pad_value"].scale == (0.0,) or result.table.entries["pad_value"].scale[0] > 0


def test_qoperator_format_table(small_models, tmp_path):
    options = QuantizeOptions(format=QuantFormatChoice.QOPERATOR, activation_type=QuantTypeChoice.UINT8)
    result = quantize_model(small_models["classifier"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]), options)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert "QLinearConv" in ops
    x = result.table.entries["x"]
    assert x.kind == "activation" and x.quant_type == "uint8" and x.nodes == ("conv_quant",)
    arrays = np.load(small_models["arrays"])
    assert x.range_min == pytest.approx(float(arrays.min()), rel=1e-6) and x.range_max == pytest.approx(float(arrays.max()), rel=1e-6)
    assert x.scale[0] == pytest.approx((arrays.max() - arrays.min()) / 255.0, rel=1e-5)


@pytest.mark.parametrize("method", list(CalibrationMethodChoice))
def test_every_calibration_method_runs(small_models, tmp_path, method):
    result = quantize_model(
        small_models["classifier"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]),
        calibration=CalibrationOptions(method=method),
    )
    arrays = np.load(small_models["arrays"])
    x = result.table.entries["x"]
    assert result.params["calibration"]["method"] == method.value
    assert x.scale[0] > 0
    if method is CalibrationMethodChoice.MINMAX:
        assert x.range_max == pytest.approx(float(arrays.max()), rel=1e-6)
    else:  # histogram methods keep (or clip) the measured magnitude, never widen it
        assert max(abs(x.range_min), abs(x.range_max)) <= float(np.abs(arrays).max()) * (1 + 1e-6)


def test_percentile_parameter_is_honoured(small_models, tmp_path):
    ranges = {}
    for percentile in (90.0, 99.999):
        result = quantize_model(
            small_models["classifier"], tmp_path / f"q{percentile}.onnx", open_input_set(small_models["arrays"]),
            calibration=CalibrationOptions(method=CalibrationMethodChoice.PERCENTILE, percentile=percentile),
        )
        ranges[percentile] = result.table.entries["x"].range_max
        assert result.params["calibration"]["percentile"] == percentile
    assert ranges[90.0] < ranges[99.999]


def test_int16_activations(small_models, tmp_path):
    options = QuantizeOptions(activation_type=QuantTypeChoice.UINT16, weight_type=QuantTypeChoice.INT8)
    result = quantize_model(small_models["classifier"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]), options)
    assert result.table.entries["x"].quant_type == "uint16"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ort.InferenceSession(str(tmp_path / "q.onnx"), so, providers=["CPUExecutionProvider"])


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="checks the CPU-only refusal")
def test_cuda_calibration_without_cuda_is_unavailable(small_models, tmp_path):
    with pytest.raises(UnavailableError, match=r"execution provider cuda \(CUDAExecutionProvider\) is not in this onnxruntime"):
        quantize_model(small_models["classifier"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]),
                       calibration=CalibrationOptions(execution=ExecutionOptions("cuda")))
    assert not (tmp_path / "q.onnx").exists()


def test_empty_calibration_set(small_models, tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 3, 8, 8), np.float32))
    with pytest.raises(InputError, match=r"calibration set .*empty.npy is empty"):
        quantize_model(small_models["classifier"], tmp_path / "q.onnx", open_input_set(tmp_path / "empty.npy"))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CalibrationOptions(percentile=99.0), r"calibration.percentile does not apply to method MinMax"),
        (lambda: CalibrationOptions(method=CalibrationMethodChoice.ENTROPY, num_bins=1), r"calibration.num_bins must be >= 2"),
        (lambda: CalibrationOptions(method=CalibrationMethodChoice.PERCENTILE, percentile=101.0), r"percentile must be in \(0, 100\]"),
        (lambda: QuantizeOptions(weight_type=QuantTypeChoice.UINT8), r"activation_type int8 with weight_type uint8 is not supported"),
        (lambda: QuantizeOptions(format=QuantFormatChoice.QOPERATOR, activation_type=QuantTypeChoice.INT16), r"16-bit .* need format QDQ"),
        (lambda: QuantizeOptions(min_top1_agreement=2.0), r"min_top1_agreement must be in \[0, 1\]"),
    ],
)
def test_invalid_options(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_resolved_parameters_are_recorded(nsfw_run):
    params = _manifest(nsfw_run).stage("quantize")["params"]
    assert params["calibration"] == {"method": "MinMax", "provider": "cpu", "symmetric": False, "moving_average": False,
                                     "averaging_constant": 0.01, "execution": ExecutionOptions().to_json()}
    assert params["weight_symmetric"] is True and params["per_channel"] is True and params["calibration_count"] == 12
    assert params["ort_arguments"]["extra_options"] == {"ActivationSymmetric": False, "WeightSymmetric": True}
