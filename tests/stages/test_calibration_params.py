"""Calibration parameters are read from the graph (the scale and zero-point inputs of Q/DQ and QLinear* nodes),
never from an initializer's name: a Caffe BatchNorm's gamma ``<layer>_scale`` is no scale (issue 27 item 9)."""

from __future__ import annotations

import json

import onnx
import pytest

from qconsist.diff.artifacts import model_changes
from qconsist.errors import FidelityError
from qconsist.inputs import open_input_set
from qconsist.stages.calibration_table import build_table, quantization_parameters
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline
from qconsist.stages.quantize import QuantizeOptions, quantize_model
from caffe_builder import NetBuilder
from judge_models import batchnorm_negative_gamma
from onnx_builders import save_arrays


@pytest.fixture
def arrays(tmp_path):
    return save_arrays(tmp_path / "calibration.npy", 4, seed=1)


def test_a_batchnorm_gamma_named_scale_with_negative_values_is_no_refusal(tmp_path, arrays):
    model = batchnorm_negative_gamma(tmp_path / "bn.onnx")
    result = quantize_model(model, tmp_path / "q.onnx", open_input_set(arrays), QuantizeOptions(nodes_to_exclude=("bn",)))
    assert result.issues == []
    assert {t: (e.scale_initializer, e.kind) for t, e in result.table.entries.items()} == {
        "input": ("input_scale", "activation"), "w1": ("w1_scale", "weight"), "b1": ("b1_quantized_scale", "bias"),
        "r1": ("r1_scale", "activation"), "bn_out": ("bn_out_scale", "activation"), "w2": ("w2_scale", "weight"),
        "out": ("out_scale", "activation"),
    }
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    assert "bn_scale" in {i.name for i in quantized.graph.initializer}  # the gamma, kept in float
    assert "bn_scale" not in quantization_parameters(quantized)
    assert all(min(e.scale) > 0 for e in build_table(quantized).entries.values())


def test_a_scale_the_quantizer_really_made_negative_is_still_refused(tmp_path, arrays):
    # the BatchNorm's output named "bn": onnxruntime names its scale "bn_scale", finds the gamma under that name
    # and quantizes the tensor with it: the model really has a negative scale
    model = batchnorm_negative_gamma(tmp_path / "bn.onnx", output="bn")
    with pytest.raises(FidelityError) as caught:
        quantize_model(model, tmp_path / "q.onnx", open_input_set(arrays), QuantizeOptions(nodes_to_exclude=("bn",)))
    assert caught.value.message == (
        "quantization produced invalid parameters: tensor 'bn' (consumed by conv2) has a negative scale in 'bn_scale' "
        "(2 value(s)); set [quantize] allow_invalid_scales = true to keep the model anyway")


def test_diff_names_no_batchnorm_gamma_a_quantization_parameter(tmp_path, arrays):
    model = batchnorm_negative_gamma(tmp_path / "bn.onnx")
    quantize_model(model, tmp_path / "q.onnx", open_input_set(arrays), QuantizeOptions(nodes_to_exclude=("bn",)))
    a = onnx.load(str(tmp_path / "q.onnx"))
    b = onnx.load(str(tmp_path / "q.onnx"))
    for initializer in b.graph.initializer:
        if initializer.name in ("bn_scale", "bn_out_scale"):
            values = onnx.numpy_helper.to_array(initializer) * 2
            initializer.CopyFrom(onnx.numpy_helper.from_array(values, initializer.name))
    changed = {c.name: c.quantization_parameter for c in model_changes(a, b).initializers_changed}
    assert changed == {"bn_scale": False, "bn_out_scale": True}


def test_a_caffe_batchnorm_with_negative_gammas_kept_in_float_runs_through_the_pipeline(tmp_path, arrays):
    net = NetBuilder(name="bnneg", seed=3)
    x = net.relu(net.conv(net.input((1, 3, 8, 8)), 4, kernel_size=3, pad=1))
    x = net.scale(net.batch_norm(x), bias=True)
    net.blobs["scale4"][0][1::2] *= -1  # gammas 1.31, -1.32, 0.75, -0.98: caffe2onnx names them scale4_scale
    net.conv(x, 2, kernel_size=3, pad=1)
    prototxt, caffemodel = net.write(tmp_path)
    config = parse_pipeline({"name": "bnneg", "model": {"prototxt": str(prototxt), "caffemodel": str(caffemodel)},
                             "calibration": {"data": str(arrays)}, "quantize": {"nodes_to_exclude": ["batchnorm3"]}},
                            tmp_path / "pipeline.toml")
    run = run_pipeline(config, runs_dir=tmp_path / "runs", run_id="bnneg")
    quantized = onnx.load(str(run.path / "quantize" / "model.onnx"))
    gamma = next(i for i in quantized.graph.initializer if i.name == "scale4_scale")
    assert (onnx.numpy_helper.to_array(gamma) < 0).sum() == 2  # kept in float, negative, and no scale
    table = json.loads((run.path / "manifest.json").read_text())["calibration"]
    assert table["issues"] == [] and "scale4" not in table["table"]
    assert all(e["scale_initializer"] != "scale4_scale" for e in table["table"].values())
