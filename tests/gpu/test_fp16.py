"""--precision fp16 on the CPU: a model built to overflow float16, and open_nsfw, which does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconsist.errors import ConfigError, UnsupportedModelError
from qconsist.locate.fp16 import FLOAT16_MAX, Fp16Options, Fp16Report, analyse_fp16, convert_to_fp16

WEIGHT = 6000.0  # below the converter's clamp (10000), large enough to push a sum of 27 values past 65504


def build_overflow_model(path: Path) -> Path:
    """x (1×3×6×6, values in [0, 1]) → conv_small (×1) → relu_small → conv_big (×6000) → relu_big → mean."""
    nodes = [
        helper.make_node("Conv", ["x", "w_small"], ["small"], name="conv_small", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["small"], ["small_relu"], name="relu_small"),
        helper.make_node("Conv", ["small_relu", "w_big"], ["big"], name="conv_big", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["big"], ["big_relu"], name="relu_big"),
        helper.make_node("ReduceMean", ["big_relu"], ["y"], name="mean", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.full((3, 3, 3, 3), 1.0 / 27, np.float32), "w_small"),
         numpy_helper.from_array(np.full((2, 3, 3, 3), WEIGHT, np.float32), "w_big")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _samples() -> list[dict]:
    rng = np.random.default_rng(7)
    return [{"x": rng.random((1, 3, 6, 6), dtype=np.float32)} for _ in range(3)]


def _independent_peaks(sample: np.ndarray) -> tuple[float, float]:
    """max |conv_small| and max |conv_big| with numpy (zero padding 1, 3×3 kernels of constant weight)."""
    def conv(x: np.ndarray, weight: float) -> np.ndarray:
        padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
        out = np.zeros(x.shape[1:], np.float64)
        for dy in range(3):
            for dx in range(3):
                out += padded[:, dy:dy + x.shape[1], dx:dx + x.shape[2]].sum(axis=0)
        return out * weight

    small = np.maximum(conv(sample[0].astype(np.float64), 1.0 / 27), 0.0)
    return float(np.abs(small).max()), float(np.abs(conv(small[None].repeat(3, 0), WEIGHT)).max())


def test_first_overflow_and_nonfinite_node(tmp_path):
    model = build_overflow_model(tmp_path / "overflow.onnx")
    samples = _samples()
    report = analyse_fp16(model, samples)
    peaks = [_independent_peaks(s["x"]) for s in samples]
    assert all(small < FLOAT16_MAX < big for small, big in peaks)
    assert not report.passed and not report
    assert report.first_overflow is not None and report.first_overflow.label == "conv_big"
    assert report.first_overflow.sample == 0
    assert report.first_overflow.max_abs_fp32 == pytest.approx(peaks[0][1], rel=1e-5)
    # ONNX Runtime's CPU EP runs this float16 model in float32 (casts removed between nodes): measured.
    assert report.first_nonfinite is None
    assert not report.stored_as_float16 and report.float16_tensors == 0 and report.float_tensors == 7
    assert "computed the float16 model in float32" in report.note()
    assert report.truncated_constants == 0
    assert report.execution["provider"] == "cpu"
    assert Fp16Report.from_json(report.to_json()).to_json() == report.to_json()


def test_open_nsfw_float16_on_cpu_is_finite_and_agrees(nsfw_models, photo_samples):
    report = analyse_fp16(nsfw_models["float"], photo_samples)
    assert report.passed
    assert report.first_nonfinite is None and report.first_overflow is None
    assert report.top1_agree == len(photo_samples)
    assert 0 < report.output_greatest_abs < 1e-2
    assert report.truncated_constants > 0  # open_nsfw has weights below float16's smallest normal


def test_fp16_errors(tmp_path, nsfw_models):
    with pytest.raises(ConfigError, match=r"fp16 overflow limit must be in \(0, 65504.0\]"):
        Fp16Options(overflow_limit=1e6)
    with pytest.raises(ConfigError, match="the fp16 analysis needs at least one input sample"):
        analyse_fp16(nsfw_models["float"], [])
    integer = helper.make_model(helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "ints",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(integer, str(tmp_path / "ints.onnx"))
    with pytest.raises(UnsupportedModelError, match="has no float32 tensors to convert"):
        convert_to_fp16(tmp_path / "ints.onnx", tmp_path / "ints16.onnx")
