"""Pipeline files: the bundled open_nsfw pipeline, every section, and one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from qconsist.errors import ConfigError, InputError
from qconsist.pipeline.config import ModelKind, load_pipeline, parse_pipeline
from qconsist.stages.optimize import OptimizeMethod
from qconsist.stages.quantize import CalibrationMethodChoice, DistributionScenario, QuantFormatChoice, QuantTypeChoice

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"model": {"onnx": "m.onnx"}, "calibration": {"data": "x.npy"}}


def test_open_nsfw_pipeline():
    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    assert config.name == "open_nsfw" and config.model.kind is ModelKind.BUNDLED and config.model.source == "open_nsfw"
    assert config.convert.opset == 17 and config.convert.dynamic_batch is False
    assert config.optimize.method is OptimizeMethod.PRE_PROCESS and config.optimize.atol == 1e-5
    pre = config.preprocess
    assert pre.resize == (256, 256) and pre.crop == (224, 224) and pre.channel_order.value == "BGR"
    assert pre.mean == (104.0, 117.0, 123.0) and pre.pixel_range == 255.0
    cal = config.calibration
    assert (cal.inputs.data, cal.inputs.offset, cal.inputs.count, cal.repeat) == ("package:photos", 0, 12, 3)
    assert cal.options.method is CalibrationMethodChoice.MINMAX and cal.options.provider == "cpu"
    q = config.quantize
    assert q.format is QuantFormatChoice.QDQ and q.per_channel and q.activation_type is QuantTypeChoice.INT8
    assert (config.evaluation.offset, config.evaluation.count) == (12, 9)
    assert config.runs_dir == Path("runs")


def test_defaults_and_relative_paths(tmp_path):
    config = parse_pipeline(MINIMAL, tmp_path / "p.toml")
    assert config.name == "p" and config.model.onnx == tmp_path / "m.onnx"
    assert config.calibration.inputs.data == str(tmp_path / "x.npy")
    assert config.calibration.repeat == 1 and config.evaluation is None and config.preprocess is None
    assert config.quantize.per_channel is False and config.quantize.weight_type is QuantTypeChoice.INT8
    assert config.to_json()["quantize"]["weight_symmetric"] is True


def test_method_parameters(tmp_path):
    data = {**MINIMAL, "calibration": {"data": "x.npy", "method": "distribution", "num_bins": 512, "scenario": "p3"}}
    options = parse_pipeline(data, tmp_path / "p.toml").calibration.options
    assert options.method is CalibrationMethodChoice.DISTRIBUTION and options.scenario is DistributionScenario.P3
    assert options.resolved() == {"num_bins": 512, "scenario": "p3"}


@pytest.mark.parametrize(
    "data, message",
    [
        ({**MINIMAL, "quantize": {"per_chanel": True}}, r"p.toml: unknown key 'quantize.per_chanel' \(known in \[quantize\]: "),
        ({**MINIMAL, "colour": 1}, r"p.toml: unknown key 'colour' \(known in \[top level\]: "),
        ({**MINIMAL, "model": {"onnx": "m.onnx", "weights": "w"}}, r"unknown key 'model.weights'"),
        ({**MINIMAL, "preprocess": {"resise": [1, 2]}}, r"p.toml: preprocess: unknown key\(s\) resise"),
        ({**MINIMAL, "model": {"onnx": "m.onnx", "source": "open_nsfw"}}, r"\[model\] needs exactly one of source, prototxt \+ caffemodel, onnx \(got source, onnx\)"),
        ({**MINIMAL, "model": {"prototxt": "a.prototxt"}}, r"\[model\] needs both prototxt and caffemodel"),
        ({"model": {"onnx": "m.onnx"}}, r"p.toml: \[calibration\] is missing"),
        ({**MINIMAL, "calibration": {"data": "x.npy", "repeat": 0}}, r"calibration.repeat must be between 1 and 100, got 0"),
        ({**MINIMAL, "calibration": {"data": "x.npy", "count": 0}}, r"calibration.count must be > 0, got 0"),
        ({**MINIMAL, "calibration": {"data": "x.npy", "method": "Median"}}, r"calibration.method must be one of MinMax, Entropy, Percentile, Distribution, got 'Median'"),
        ({**MINIMAL, "calibration": {"data": "x.npy", "percentile": 99.0}}, r"p.toml: calibration.percentile does not apply to method MinMax"),
        ({**MINIMAL, "calibration": {"data": "x.npy", "provider": "tpu"}}, r"calibration.provider must be one of cpu, cuda"),
        ({**MINIMAL, "quantize": {"per_channel": "yes"}}, r"quantize.per_channel must be true or false, got 'yes'"),
        ({**MINIMAL, "quantize": {"activation_type": "int4"}}, r"quantize.activation_type must be one of int8, uint8, int16, uint16"),
        ({**MINIMAL, "optimize": {"atol": True}}, r"optimize.atol must be a number, got True"),
        ({**MINIMAL, "evaluation": {"offset": 3}}, r"evaluation.data is missing"),
        ({**MINIMAL, "model": "m.onnx"}, r"p.toml: \[model\] must be a table"),
    ],
)
def test_invalid_files(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_pipeline(data, tmp_path / "p.toml")
    assert info.value.message.count("p.toml") == 1


def test_convert_opset_is_validated(tmp_path):
    data = {"model": {"source": "open_nsfw"}, "convert": {"opset": 28}, "calibration": {"data": "package:photos"}}
    with pytest.raises(ConfigError, match=r"p.toml: convert.opset 28 is not supported; choose one of 13, "):
        parse_pipeline(data, tmp_path / "p.toml")


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match=r"pipeline file .*nope.toml does not exist"):
        load_pipeline(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("name = \n")
    with pytest.raises(ConfigError, match=r"bad.toml: invalid TOML \(Invalid value"):
        load_pipeline(tmp_path / "bad.toml")



def test_cuda_calibration_options_are_typed_and_cuda_only(tmp_path):
    """[calibration] cudnn_conv_algo_search / use_tf32 reach the calibration session; CPU refuses them."""
    import pytest

    from qconsist.errors import ConfigError
    from qconsist.inference.session import ConvAlgoSearch
    from qconsist.pipeline.config import parse_pipeline

    calibration = {"data": "package:photos", "provider": "cuda", "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False}
    base = {"model": {"onnx": str(tmp_path / "m.onnx")}, "calibration": calibration}
    options = parse_pipeline(base, tmp_path / "p.toml").calibration.options
    assert options.execution.option("cudnn_conv_algo_search") is ConvAlgoSearch.HEURISTIC
    assert options.execution.option("use_tf32") is False
    assert options.execution.ort_providers()[0] == ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0"})
    assert options.to_json()["execution"]["provider_options"] == {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False}
    with pytest.raises(ConfigError, match=r"calibration.cudnn_conv_algo_search applies to provider = \"cuda\" only"):
        parse_pipeline({**base, "calibration": {**calibration, "provider": "cpu"}}, tmp_path / "p.toml")
