"""The FCN-style Caffe models (``fcn_models.py``) through the pipeline's stages: convert with the numpy
Caffe reference check on, determinize, quantize (QDQ, per channel, 6 seeded calibration inputs).

Figures asserted are those measured on a 2-core x86-64 machine (onnxruntime 1.31.1): conversion within
1e-6 of the reference, rewrite within 1e-6 of the converted model; int8 against float on a seeded image:
mean difference 0.007-0.009, greatest 0.04-0.14 (under 10% of the output's peak), 97-98% of the pixels
keep their class.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from caffe_builder import tolerance
from fcn_models import FCN_MODELS

from qconsist.inputs import open_input_set
from qconsist.stages.caffe import reference
from qconsist.stages.convert import convert_caffe
from qconsist.stages.determinize import determinize
from qconsist.stages.quantize import QuantizeOptions, quantize_model

CONVERTED_OPS = {
    "fcn_head": ["Conv", "Relu", "ConvTranspose", "Conv"],
    "fcn_skip": ["Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "Conv", "ConvTranspose",
                 "Conv", "Slice", "Sum", "ConvTranspose", "Slice"],
}
OUTPUT_SHAPES = {"fcn_head": (1, 21, 112, 112), "fcn_skip": (1, 21, 56, 56)}


@pytest.fixture(scope="module")
def fcn(tmp_path_factory):
    """Per model: the Caffe network, the converted, determinized and both quantized ONNX models."""
    root = tmp_path_factory.mktemp("fcn")
    calibration = root / "calibration.npy"
    np.save(calibration, np.random.default_rng(7).standard_normal((6, 3, 56, 56)).astype(np.float32))
    out = {}
    for name, build in FCN_MODELS.items():
        net = build(seed=0)
        prototxt, caffemodel = net.write(root)
        converted = convert_caffe(prototxt, caffemodel, root / f"{name}.onnx")
        determinized = determinize(converted.path, root / f"{name}_determinized.onnx")
        quantized = {
            key: quantize_model(path, root / f"{name}_{key}_int8.onnx", open_input_set(calibration, input_name="data_input"),
                                QuantizeOptions(per_channel=True))
            for key, path in (("converted", converted.path), ("determinized", determinized.path))
        }
        out[name] = {"net": net, "converted": converted, "determinized": determinized, "quantized": quantized}
    return out


def _run(path, x):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _image(seed=11):
    return np.random.default_rng(seed).standard_normal((1, 3, 56, 56)).astype(np.float32)


def _ops(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


@pytest.mark.parametrize("name", FCN_MODELS)
def test_conversion_matches_the_caffe_reference(fcn, name):
    converted = fcn[name]["converted"]
    assert converted.check.passed and converted.check.max_abs < 1e-6
    assert _ops(converted.path) == CONVERTED_OPS[name]
    net = fcn[name]["net"]
    x = _image()
    (want,) = reference.forward(net.net, net.blobs, {"data": x}, dtype=np.float64).values()
    got = _run(converted.path, x)
    assert got.shape == want.shape == OUTPUT_SHAPES[name]
    assert np.abs(got - want).max() <= tolerance(want)


def test_fcn_skip_crops_keep_the_class_channels(fcn):
    repairs = fcn["fcn_skip"]["converted"].repairs
    assert any("Crop 'crop16': Slice axes=[2, 3] starts=[2, 2] ends=[58, 58]" in line and "axes=[1, 2, 3]" in line for line in repairs)


@pytest.mark.parametrize("name, folded", [("fcn_head", []), ("fcn_skip", ["crop13", "crop16"])])
def test_determinize_removes_every_overlapping_conv_transpose(fcn, name, folded):
    result = fcn[name]["determinized"]
    ops = _ops(result.path)
    assert "ConvTranspose" not in ops and ops.count("DepthToSpace") == len(result.rewritten) == CONVERTED_OPS[name].count("ConvTranspose")
    assert "Slice" not in ops  # FCN's crops fold into the sub-pixel pads: k4 s2 crop 1 and k8 s4 crop 2 are pad (k - s) / 2
    assert [f for r in result.rewritten for f in r.folded] == folded
    assert all(r.details["conv_kernel"] == [3, 3] for r in result.rewritten)
    assert result.passed and result.max_abs < 1e-6
    onnx.checker.check_model(onnx.load(str(result.path)), full_check=True)
    x = _image(12)
    want, got = _run(fcn[name]["converted"].path, x), _run(result.path, x)
    assert np.abs(got - want).max() <= 1e-6 + 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("name", FCN_MODELS)
@pytest.mark.parametrize("source", ["converted", "determinized"])
def test_quantize(fcn, name, source):
    result = fcn[name]["quantized"][source]
    assert result.issues == []
    ops = Counter(_ops(result.path))
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > ops["QuantizeLinear"]
    upsampling = CONVERTED_OPS[name].count("ConvTranspose")
    assert ops["ConvTranspose" if source == "converted" else "DepthToSpace"] == upsampling
    x = _image(13)
    floating = _run(fcn[name][source].path, x)
    integer = _run(result.path, x)
    difference = np.abs(integer - floating)
    assert difference.mean() < 0.01 and difference.max() < 0.1 * np.abs(floating).max()
    assert (integer.argmax(1) == floating.argmax(1)).mean() > 0.96  # per-pixel class agreement

