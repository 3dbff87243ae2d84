"""The calibration table read back from quantized models: JSON form, shared scales, non-finite values."""

from __future__ import annotations

import json

import onnx

from qconsist.stages.calibration_table import CalibrationTable, build_table
from qconsist.store.serde import dumps, loads
from qconsist.inputs import open_input_set
from qconsist.stages.quantize import QuantizeOptions, quantize_model


def test_non_finite_values_survive_strict_json(small_models, tmp_path):
    result = quantize_model(small_models["pad_pool"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]),
                            QuantizeOptions(allow_invalid_scales=True))
    text = dumps(result.table)
    json.loads(text)  # strict JSON: non-finite values are null, named in the "nonfinite" map
    assert '"max": null' in text and '"/padded/min": "-inf"' in text
    again = CalibrationTable.from_json(loads(text))
    assert again.entries["padded"].scale == (float("inf"),) and again.entries["padded"].range_min == float("-inf")
    assert [i.to_json() for i in again.issues()] == [i.to_json() for i in result.issues]


def test_shared_scale_maps_to_every_tensor_using_it(small_models, tmp_path):
    quantize_model(small_models["pad_pool_zero"], tmp_path / "q.onnx", open_input_set(small_models["arrays"]))
    table = build_table(onnx.load(str(tmp_path / "q.onnx")))
    users = {e.tensor for e in table.by_initializer()["relu_scale"]}
    assert users == {"relu", "padded", "y"}  # Pad and MaxPool outputs keep their input's scale
    assert table.entries["y"].nodes == ("<output y>",)
    assert table.entries["W"].kind == "weight" and table.entries["W"].data_initializer == "W_quantized"
    assert table.entries["B"].kind == "bias" and table.entries["B"].quant_type == "int32"
