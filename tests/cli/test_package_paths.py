"""``package:<module>/<file>`` wherever a path is read: command arguments and options, input sets, pipeline
files — one resolver (qconsist.inputs.package)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import skimage
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.inputs import open_input_set
from qconsist.inputs.preprocess import Preprocess
from qconsist.pipeline.config import parse_pipeline

SIGMOID = "package:onnxruntime/datasets/sigmoid.onnx"
SIGMOID_PATH = Path(onnxruntime.__file__).parent / "datasets" / "sigmoid.onnx"


def test_model_argument_and_inputs(tmp_path):
    out = CliRunner().invoke(app, ["inspect", SIGMOID])
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"model {SIGMOID_PATH}: md5 ")
    arrays = tmp_path / "x.npy"
    np.save(arrays, np.zeros((2, 4, 5), np.float32))
    # the model (input x: [3, 4, 5], no batch axis) is found and read: the samples are checked against it
    run = CliRunner().invoke(app, ["run", SIGMOID, "--inputs", str(arrays), "--runs-dir", str(tmp_path / "runs")])
    assert (run.exit_code, run.output) == (2, "error: sample 000000: input 'x' has shape [1, 4, 5], the model wants [3, 4, 5]\n")


def test_image_input_set_from_a_package():
    preprocess = Preprocess.from_dict({"resize": [16, 16], "layout": "NCHW"}, where="test")
    photos = open_input_set("package:skimage/data/astronaut.png", preprocess, "x")
    assert photos.names == ["astronaut.png"] and photos.source == str(Path(skimage.__file__).parent / "data" / "astronaut.png")
    assert photos.sample(0)["x"].shape == (1, 3, 16, 16)


def test_pipeline_file_model_entry(tmp_path):
    config = parse_pipeline({"name": "p", "model": {"onnx": SIGMOID}, "calibration": {"data": "package:photos"}}, tmp_path / "p.toml")
    assert config.model.onnx == SIGMOID_PATH


@pytest.mark.parametrize("args", [["inspect"], ["pipeline", "run"], ["calib", "repeat"], ["nightly"]])
def test_a_missing_package_file_is_one_line_exit_2(args):
    out = CliRunner().invoke(app, [*args, "package:skimage/nope.toml"])
    assert (out.exit_code, out.output) == (2, "error: package:skimage/nope.toml: package 'skimage' has no file nope.toml\n")
