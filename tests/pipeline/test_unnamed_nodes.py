"""A graph whose nodes are all unnamed (issue 27 item 11): the names qconsist invents are marked as invented
wherever they are printed and recorded ("~Sigmoid_3"), ``nodes_to_exclude`` explains them instead of refusing
blindly, and ``[optimize] name_nodes = true`` gives them stable recorded names (checked like every stage) with
which ``nodes_to_exclude`` and ``sensitivity`` work."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from judge_models import conv_relu
from onnx_builders import save_arrays
from qconsist.cli import app
from qconsist.diff.quantization import quantization_error
from qconsist.errors import InputError
from qconsist.inference import ExecutionOptions
from qconsist.inputs import open_input_set
from qconsist.locate.latency import LatencyOptions
from qconsist.sensitivity import SensitivityRequest, Target, sensitivity


def _pipeline(folder, model, arrays, extra: str = "", name: str = "unnamed"):
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{arrays}"\ncount = 8\n'
                    f'[evaluation]\ndata = "{arrays}"\noffset = 8\n{extra}')
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("unnamed")
    model = conv_relu(folder / "unnamed.onnx", opsets=(("", 13),), names=False)
    return {"folder": folder, "model": model, "arrays": save_arrays(folder / "arrays.npy", 12, seed=6)}


def _run(made, extra: str, name: str):
    out = CliRunner().invoke(app, ["pipeline", "run", str(_pipeline(made["folder"], made["model"], made["arrays"], extra, name)),
                                   "--runs-dir", str(made["folder"] / "runs"), "--run-id", name])
    return out


def test_invented_names_are_marked_in_quant_error(made):
    out = _run(made, "", "plain")
    assert out.exit_code == 0, out.output
    result = quantization_error(made["folder"] / "runs" / "plain", open_input_set(made["arrays"], None, "input"),
                                ExecutionOptions(graph_optimization_level="disable"))
    assert sorted((e.node, e.invented) for e in result.tensors + result.outputs) == [
        ("input", False), ("~Conv_2", True), ("~Relu_1", True), ("~Sigmoid_3", True)]
    assert {(w.node, w.invented) for w in result.weights} == {("~Conv_0", True), ("~Conv_2", True)}
    assert "~Sigmoid_10" in result.internal  # the quantized graph's own unnamed nodes: marked too


def test_nodes_to_exclude_explains_an_invented_name(made):
    out = _run(made, '[quantize]\nnodes_to_exclude = ["Sigmoid_3"]\n', "refused")
    assert out.exit_code == 2
    assert out.stderr == (
        "error: quantize.nodes_to_exclude: 'Sigmoid_3' is the name qconsist invents for the unnamed Sigmoid node at "
        "position 3 (reports mark it ~); onnxruntime excludes nodes by their names in the model only: set [optimize] "
        "name_nodes = true to give the model's unnamed nodes these names (without the mark), recorded and checked\n")


def test_name_nodes_gives_recorded_names_that_nodes_to_exclude_and_sensitivity_accept(made, tmp_path):
    out = _run(made, '[optimize]\nname_nodes = true\n[quantize]\nnodes_to_exclude = ["Sigmoid_3"]\n', "named")
    assert out.exit_code == 0, out.output
    run = made["folder"] / "runs" / "named"
    optimize = next(s for s in json.loads((run / "manifest.json").read_text())["stages"] if s["name"] == "optimize")
    assert optimize["params"]["name_nodes"] is True
    assert optimize["checks"]["named_nodes"] == {"Conv_0": "Conv", "Relu_1": "Relu", "Conv_2": "Conv", "Sigmoid_3": "Sigmoid"}
    assert optimize["checks"]["outputs_vs_convert"]["passed"] is True  # the named model is the one checked
    quantized = onnx.load(str(run / "quantize" / "model.onnx"))
    sigmoid = next(n for n in quantized.graph.node if n.op_type == "Sigmoid")
    assert sigmoid.name == "Sigmoid_3"
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in sigmoid.output for n in quantized.graph.node)  # left in float
    plain = onnx.load(str(made["folder"] / "runs" / "plain" / "quantize" / "model.onnx"))
    assert any(n.op_type == "QuantizeLinear" and n.input[0] == "out_QuantizeLinear_Input" for n in plain.graph.node)
    # sensitivity had nothing to keep in float; now every quantizable node has a name
    request = SensitivityRequest(targets=(Target.parse("sqnr>=60"),), latency=LatencyOptions(warmup=0, runs=3))
    plain = made["folder"] / "runs" / "plain"
    with pytest.raises(InputError) as caught:
        sensitivity(plain, request, runs_dir=tmp_path / "s0", run_id="s")
    assert caught.value.message == (
        f"the optimize model of {plain} has no named node that onnxruntime quantizes (4 unnamed): nothing to keep in "
        "float; onnxruntime excludes nodes by name: set [optimize] name_nodes = true in the pipeline to name them, and "
        "run it again")
    renamed = _run(made, '[optimize]\nname_nodes = true\n', "named-all")
    assert renamed.exit_code == 0, renamed.output
    result, _ = sensitivity(made["folder"] / "runs" / "named-all", request, runs_dir=tmp_path / "s1", run_id="s")
    assert result.unnamed == 0 and result.quantizable == 4
    assert sorted(n.node for n in result.nodes) == ["Conv_0", "Conv_2", "Relu_1", "Sigmoid_3"]
