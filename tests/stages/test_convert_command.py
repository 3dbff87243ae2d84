"""``qconsist convert``: the pipeline's convert stage from the command line, with its fidelity figure."""

from __future__ import annotations

import hashlib
import json

import onnx
from caffe_builder import NetBuilder
from typer.testing import CliRunner

from qconsist.cli import app

runner = CliRunner()


def _net(tmp_path):
    net = NetBuilder(seed=1)
    net.softmax(net.pool(net.conv(net.input((1, 3, 8, 8)), 4, kernel_size=3), "MAX", kernel_size=2, stride=2))
    return net.write(tmp_path)


def test_convert_prints_the_fidelity_figure(tmp_path):
    prototxt, caffemodel = _net(tmp_path)
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["convert", str(prototxt), str(caffemodel), "-o", str(out), "--opset", "13"])
    assert result.exit_code == 0, result.stderr
    md5 = hashlib.md5(out.read_bytes()).hexdigest()
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{out}: opset 13, IR 7, md5 {md5}, ")
    assert lines[-1].startswith("fidelity: greatest abs difference ") and "vs the numpy Caffe reference" in lines[-1]
    assert lines[-1].split(": ")[-1].startswith("passed in ")
    model = onnx.load(out)
    assert model.opset_import[0].version == 13 and model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_convert_json_dynamic_batch_and_the_pipeline_stage_agree(tmp_path):
    from qconsist.stages.convert import ConvertOptions, convert_file

    prototxt, caffemodel = _net(tmp_path)
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["convert", str(prototxt), str(caffemodel), "-o", str(out), "--dynamic-batch", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema"] == "qconsist.convert/1" and data["passed"] is True and data["opset"] == 17
    assert data["check"]["passed"] is True and data["check"]["max_abs"] <= data["check"]["tolerance"]
    assert data["md5"] == hashlib.md5(out.read_bytes()).hexdigest()
    assert onnx.load(out).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    same = convert_file(prototxt, caffemodel, tmp_path / "stage.onnx", ConvertOptions(dynamic_batch=True))
    assert hashlib.md5(same.path.read_bytes()).hexdigest() == data["md5"]


def test_convert_refusals_are_one_line(tmp_path):
    prototxt, caffemodel = _net(tmp_path)
    out = tmp_path / "m.onnx"
    out.write_bytes(b"keep")
    result = runner.invoke(app, ["convert", str(prototxt), str(caffemodel), "-o", str(out)])
    assert (result.exit_code, result.stderr) == (2, f"error: {out} exists; choose another --output or pass --force\n")
    assert out.read_bytes() == b"keep"
    result = runner.invoke(app, ["convert", str(prototxt), str(caffemodel), "-o", str(caffemodel), "--force"])
    assert (result.exit_code, result.stderr) == (2, f"error: --output {caffemodel} is one of the inputs; choose another file\n")
    result = runner.invoke(app, ["convert", str(prototxt), str(caffemodel), "-o", str(tmp_path / "x.onnx"), "--opset", "9"])
    assert result.exit_code == 2
    assert result.stderr == "error: convert.opset 9 is not supported; choose one of 13, 14, 15, 16, 17, 18, 19, 20, 21\n"
    bad = tmp_path / "bad.prototxt"
    bad.write_text(prototxt.read_text().replace('type: "Softmax"', 'type: "LRN"'))
    result = runner.invoke(app, ["convert", str(bad), str(caffemodel), "-o", str(tmp_path / "y.onnx")])
    assert result.exit_code == 2 and result.stderr.startswith("error: layer '") and "has type 'LRN'" in result.stderr
    assert not (tmp_path / "y.onnx").exists()
