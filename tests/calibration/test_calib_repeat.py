"""Repeated calibration: agreement on the same inputs, and a real disagreement located tensor by tensor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qconsist.calibration.repeat import RepeatResult, calibrate_each, repeat_calibration
from qconsist.errors import InputError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions

CAFFE = Preprocess.from_dict({"resize": [256, 256], "crop": [224, 224], "channel_order": "BGR", "mean": [104, 117, 123]})


def _scales(path):
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_scale")}


def test_same_inputs_agree(small_models):
    inputs = open_input_set(small_models["arrays"])
    result = repeat_calibration(small_models["classifier"], inputs, 3)
    assert result.agree and bool(result) and len(set(result.md5s)) == 1 and len(result.runs) == 3
    assert result.differences == [] and result.other_initializers == {}
    assert result.verdict() == f"3 calibrations agree: md5 {result.runs[0].md5}"
    assert {r.inputs_digest for r in result.runs} == {inputs.digest()}


def test_pipeline_repeat_agrees_on_open_nsfw(nsfw_run):
    repeat = nsfw_run.repeat
    assert repeat.agree and len(repeat.runs) == 3
    assert repeat.runs[0].md5 == nsfw_run.artifacts["quantize"].md5


def test_different_inputs_disagree_and_name_the_tensors(nsfw_run, tmp_path):
    """Two calibrations over different photographs are really different models: the report must name
    exactly the scale initializers that differ (checked here directly with numpy) and their nodes."""
    photos = open_input_set("package:photos", CAFFE, "data_input")
    model = nsfw_run.path / "optimize" / "model.onnx"
    options = QuantizeOptions(per_channel=True)
    result = calibrate_each(model, [photos.subset(0, 3), photos.subset(3, 3)], options, CalibrationOptions(), workdir=tmp_path)
    assert not result.agree and not result.passed
    assert result.verdict().startswith("2 calibrations disagree: 2 distinct md5s, ")

    first, second = _scales(tmp_path / "run1.onnx"), _scales(tmp_path / "run2.onnx")
    differing = {name for name in first if not np.array_equal(first[name], second[name])}
    reported = {d.tensor: d for d in result.differences}
    scale_names = {name for d in result.differences for name in d.initializers if name.endswith("_scale")}
    assert scale_names == differing
    assert len(differing) > 20
    for difference in result.differences:
        scale_name = next(n for n in difference.initializers if n.endswith("_scale"))
        expected = np.abs(first[scale_name].astype(np.float64) - second[scale_name].astype(np.float64)).max()
        assert difference.scale_max_abs_diff == pytest.approx(float(expected), rel=1e-9)
        assert difference.run == 2
    relu = reported["relu_1"]
    assert relu.kind == "activation" and relu.nodes == ("pool1",)
    assert relu.min == (0.0, 0.0) and relu.max[0] != relu.max[1]
    assert "run 2: activation 'relu_1' (nodes pool1): scale differs by up to" in relu.line()
    # ranges are per calibration set; the MaxPool output shares its input's scale and is reported too
    assert reported["pool1"].initializers == relu.initializers


def test_result_round_trips_through_json(small_models):
    result = calibrate_each(
        small_models["classifier"],
        [open_input_set(small_models["arrays"]), open_input_set(small_models["arrays_b"])],
        QuantizeOptions(), CalibrationOptions(),
    )
    assert not result.agree and result.differences
    again = RepeatResult.from_json(result.to_json())
    assert again.to_json() == result.to_json()
    assert again.differences == result.differences
    assert {d.tensor for d in result.differences} >= {"x"}


def test_fewer_than_two_runs_is_an_error(small_models):
    with pytest.raises(InputError, match=r"repeated calibration needs at least 2 runs, got 1"):
        repeat_calibration(small_models["classifier"], open_input_set(small_models["arrays"]), 1)


def test_foreign_json_is_refused():
    with pytest.raises(InputError, match=r"not a repeated-calibration result \(schema 'x/1', expected qconsist.calib-repeat/1\)"):
        RepeatResult.from_json({"schema": "x/1"})


def test_optimize_and_quantize_do_not_depend_on_where_they_write(nsfw_run, tmp_path):
    """Same input model, different output folders: the same bytes (nothing path-dependent is embedded)."""
    from qconsist.stages.optimize import optimize_model
    from qconsist.stages.quantize import quantize_model
    from qconsist.store.hashing import hash_file

    photos = open_input_set("package:photos", CAFFE, "data_input").subset(0, 2)
    md5s = {"optimize": set(), "quantize": set()}
    for folder in ("a", "b/deeper"):
        out = tmp_path / folder
        optimize_model(nsfw_run.path / "convert/model.onnx", out / "optimize.onnx")
        quantize_model(out / "optimize.onnx", out / "quantize.onnx", photos, QuantizeOptions(per_channel=True))
        md5s["optimize"].add(hash_file(out / "optimize.onnx").md5)
        md5s["quantize"].add(hash_file(out / "quantize.onnx").md5)
    assert len(md5s["optimize"]) == 1 and len(md5s["quantize"]) == 1


def test_bytes_only_disagreement_is_told_apart(small_models, tmp_path):
    """Two files of one quantized model that differ only in producer metadata: md5 differs, content does not."""
    from qconsist.calibration.repeat import RepeatRun
    from qconsist.stages.quantize import quantize_model
    from qconsist.store.hashing import hash_artifact

    quantize_model(small_models["classifier"], tmp_path / "a.onnx", open_input_set(small_models["arrays"]))
    model = onnx.load(str(tmp_path / "a.onnx"))
    model.producer_version = "another build"
    onnx.save(model, str(tmp_path / "b.onnx"))
    runs = []
    for index, name in enumerate(("a.onnx", "b.onnx"), start=1):
        hashes = hash_artifact(tmp_path / name)
        runs.append(RepeatRun(index, hashes.md5, hashes.sha256, hashes.content, "same inputs", 0.0))
    result = RepeatResult(runs=runs)
    assert runs[0].md5 != runs[1].md5 and runs[0].content == runs[1].content
    assert not result.agree
    assert result.verdict() == "2 calibrations disagree in bytes only: 2 distinct md5s, one model content (metadata or encoding differ)"
