"""Preprocessing mistakes get a line that says how to fix them: an NHWC model fed NCHW images is pointed at
[preprocess] layout, and `resize = 256` asks for [height, width]."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from PIL import Image
from typer.testing import CliRunner

from qconsist.cli import app


def _channels_last_model(path):
    """[1, 8, 8, 3] → Transpose to NCHW → GlobalAveragePool → Flatten: a model that takes channels last."""
    nodes = [helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("GlobalAveragePool", ["nchw"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["features"])]
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 8, 8, 3])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _images(folder):
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    return folder


def test_a_channels_last_model_fed_channels_first_is_told_the_layout(tmp_path):
    model, images = _channels_last_model(tmp_path / "nhwc.onnx"), _images(tmp_path / "images")
    (tmp_path / "p.toml").write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "{images}"\n[preprocess]\nresize = [8, 8]\n')
    result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(images), "--pipeline", str(tmp_path / "p.toml")])
    assert result.exit_code == 2
    assert result.stderr == ("error: sample img0.png: input 'image' has shape [1, 3, 8, 8], the model wants [1, 8, 8, 3]; "
                             'if the model takes channels last, declare [preprocess] layout = "NHWC"\n')
    (tmp_path / "p.toml").write_text((tmp_path / "p.toml").read_text() + 'layout = "NHWC"\n')
    fixed = CliRunner().invoke(app, ["run", str(model), "--inputs", str(images), "--pipeline", str(tmp_path / "p.toml")])
    assert fixed.exit_code == 0, fixed.output


def test_resize_of_one_number_asks_for_height_and_width(tmp_path):
    model, images = _channels_last_model(tmp_path / "nhwc.onnx"), _images(tmp_path / "images")
    (tmp_path / "p.toml").write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "{images}"\n[preprocess]\nresize = 256\n')
    result = CliRunner().invoke(app, ["pipeline", "run", str(tmp_path / "p.toml")])
    assert result.exit_code == 2
    assert result.stderr == (f"error: {tmp_path / 'p.toml'}: preprocess.resize must be [height, width] of positive "
                             "integers, got 256 (a square: resize = [256, 256])\n")
