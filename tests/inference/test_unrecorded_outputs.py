"""An output of an element type qconsist does not record is refused in one line, exit 2 (never exit 4).

onnxruntime 1.32.0 runs ONNX's Cast-to-float8 node tests, whose float8 outputs reached the fingerprint table and
ended in "a tensor's element type differs from its column's" (exit 4); a string output shows the same on every
onnxruntime version the project supports."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from typer.testing import CliRunner

from qconsist.cli import app


def test_a_string_output_is_refused_in_one_line(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, ["N", 4])
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING, name="cast")], "s", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "s.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    for dump in ([], ["--dump"]):
        result = CliRunner().invoke(app, ["run", str(tmp_path / "s.onnx"), "--inputs", str(tmp_path / "x.npy"), *dump,
                                          "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 2, result.output
        assert result.stderr == (f"error: model {tmp_path / 's.onnx'}: output 'y' is tensor(string), an element type "
                                 "qconsist does not record (bool, float16/32/64, and 8- to 64-bit integers)\n")
