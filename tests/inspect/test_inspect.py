"""qconsist inspect: a model's inputs, opset, ops and quantized share; a run's stages, hashes, inputs, options,
environment and dump — checked against the files themselves."""

from __future__ import annotations

import hashlib
import shlex

import onnx
from typer.testing import CliRunner

from explain.qdq_models import qdq_conv_model
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.inspect import ModelSummary, RunSummary, inspect_path
from qconsist.store.serde import encode, loads


def test_float_model(tmp_path):
    path = build_classifier_model(tmp_path / "classifier.onnx", batch="N")
    summary = inspect_path(path)
    assert isinstance(summary, ModelSummary)
    assert summary.md5 == hashlib.md5(path.read_bytes()).hexdigest()
    assert (summary.ir_version, summary.opsets, summary.producer) == (8, {"": 17}, "qconsist-tests")
    assert [(v.name, v.dtype, v.shape) for v in summary.inputs] == [("x", "float32", ["N", 3, 8, 8])]
    assert [(v.name, v.dtype, v.shape) for v in summary.outputs] == [("prob", "float32", ["N", 5])]
    assert summary.ops == {"Conv": 1, "Relu": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1, "Softmax": 1}
    assert (summary.initializers, summary.parameters, summary.initializer_bytes) == (4, 8 * 27 + 8 + 40 + 5, 4 * 269)
    assert (summary.format, summary.quantized_nodes, summary.computing_nodes, summary.quantized_share) == ("float", 0, 6, 0.0)


def test_qdq_model_quantized_share(tmp_path):
    summary = inspect_path(qdq_conv_model(tmp_path / "qdq.onnx"))
    assert summary.format == "QDQ"
    assert summary.ops == {"DequantizeLinear": 4, "QuantizeLinear": 2, "Conv": 1}
    assert (summary.quantized_nodes, summary.computing_nodes, summary.quantized_share) == (1, 1, 1.0)
    assert summary.integer_weight_bytes == 8 * 8 * 9 + 3  # the int8 weight and three 8-bit zero points (not the int32 bias)
    out = CliRunner().invoke(app, ["inspect", str(tmp_path / "qdq.onnx")])
    assert out.exit_code == 0, out.output
    assert "format QDQ: 1 of 1 computing nodes run quantized (100.0%)" in out.output
    assert "nodes 7: DequantizeLinear 4, QuantizeLinear 2, Conv 1" in out.output


def test_run_directory_and_json(tmp_path):
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inputs import open_input_set

    model = build_classifier_model(tmp_path / "classifier.onnx")
    inputs = open_input_set(save_arrays(tmp_path / "arrays.npy", 3, seed=2), None, "x")
    request = RunRequest(ExecutionOptions(graph_optimization_level="extended", intra_op_threads=1), dump=True,
                         raw=RawSelection.parse("conv"))
    run = run_inference(resolve_model(model), inputs, request, tmp_path / "runs", run_id="r1", command=["qconsist", "run", "a b"]).run_dir
    summary = inspect_path(run, "model")
    assert isinstance(summary, RunSummary)
    assert (summary.kind, summary.run_id, summary.status) == ("inference", "r1", "complete")
    assert summary.command == "qconsist run " + shlex.quote("a b")
    assert [s.name for s in summary.stages] == ["model"]
    assert summary.stages[0].md5 == hashlib.md5(model.read_bytes()).hexdigest()
    assert summary.inputs["inputs"]["count"] == 3 and summary.inputs["inputs"]["kind"] == "arrays"
    assert summary.options["graph_optimization_level"] == "extended" and summary.options["intra_op_threads"] == 1
    assert summary.environment["packages"]["onnx"] == onnx.__version__
    assert summary.dump is not None and summary.dump.faithful is True and summary.dump.level == "extended"
    assert summary.dump.raw_mode == "nodes" and summary.dump.raw_tensors == 3  # conv's output in 3 samples
    assert summary.files == sum(1 for p in run.rglob("*") if p.is_file())
    assert summary.stage_model is not None and summary.stage_model.ops["Conv"] == 1
    out = CliRunner().invoke(app, ["inspect", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = loads(out.output)
    assert data["schema"] == "qconsist.inspect.run/1" and data["stage_model"] is None
    assert encode(RunSummary.from_json(data).to_json()) == encode(data)
    text = CliRunner().invoke(app, ["inspect", str(run)])
    assert f"run {run}: inference, complete" in text.output
    assert "dump: " in text.output and "faithful True (3 samples checked), raw nodes (3 tensors kept)" in text.output


def test_refusals(tmp_path):
    missing = CliRunner().invoke(app, ["inspect", str(tmp_path / "none.onnx")])
    assert (missing.exit_code, missing.output) == (2, f"error: model {tmp_path / 'none.onnx'} does not exist\n")
    (tmp_path / "bad.onnx").write_bytes(b"\x00garbage")
    bad = CliRunner().invoke(app, ["inspect", str(tmp_path / "bad.onnx")])
    assert bad.exit_code == 2 and bad.output.startswith(f"error: {tmp_path / 'bad.onnx'} is not a readable ONNX model")
    stage = CliRunner().invoke(app, ["inspect", str(tmp_path / "bad.onnx"), "--stage", "quantize"])
    assert (stage.exit_code, stage.output) == (2, "error: --stage applies to a run directory, not to a model file\n")
    (tmp_path / "empty").mkdir()
    run = CliRunner().invoke(app, ["inspect", str(tmp_path / "empty")])
    assert run.exit_code == 2 and "is incomplete" in run.output
