"""Messages name the model's real ai.onnx opset, as onnxruntime reads it (issue 27 item 11)."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from qconsist.errors import ConfigError
from qconsist.inputs import open_input_set
from qconsist.onnxfile import ai_onnx_opset
from qconsist.stages.quantize import QuantizeOptions, quantize_model
from judge_models import conv_relu
from onnx_builders import save_arrays


def test_an_opset_12_model_with_a_stray_ai_onnx_entry_is_named_opset_12(tmp_path):
    (tmp_path / "optimize").mkdir()
    model = conv_relu(tmp_path / "optimize" / "model.onnx", opsets=(("ai.onnx", 1), ("", 12)))
    ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])  # onnxruntime runs it as opset 12 (Relu-6 and on)
    with pytest.raises(ConfigError) as caught:
        quantize_model(model, tmp_path / "q.onnx", open_input_set(save_arrays(tmp_path / "a.npy", 2, seed=3)),
                       QuantizeOptions(per_channel=True))
    assert caught.value.message == (
        "quantize.per_channel with format QDQ needs ai.onnx opset 13 (DequantizeLinear's axis); the model to quantize "
        "(optimize/model.onnx) has ai.onnx opset 12: set [convert] opset = 13 in the pipeline file (an ONNX entry is "
        "upgraded by onnx.version_converter and checked against the original)")
    assert ai_onnx_opset(onnx.load(str(model))) == 12


def test_the_last_entry_holds_as_onnxruntime_reads_it(tmp_path):
    assert ai_onnx_opset(onnx.load(str(conv_relu(tmp_path / "a.onnx", opsets=(("", 12),))))) == 12
    assert ai_onnx_opset(onnx.load(str(conv_relu(tmp_path / "b.onnx", opsets=(("ai.onnx.ml", 3), ("", 11)))))) == 11
    model = onnx.load(str(conv_relu(tmp_path / "c.onnx")))
    del model.opset_import[:]
    assert ai_onnx_opset(model) is None
