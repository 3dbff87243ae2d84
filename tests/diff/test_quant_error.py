"""quant-error on the real open_nsfw: the ranking checked against onnxruntime's own qdq_loss_debug (the QDQ
graph, level disable) and against a direct computation on tensors of the graph ORT runs in production."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import qdq_loss_debug
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.diff.quantization import QuantErrorResult, quantization_error
from qconsist.inference import ExecutionOptions, resolve_model
from qconsist.inference.session import input_specs
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import load_pipeline
from qconsist.store.serde import encode, loads

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"
SAMPLES = 3


@pytest.fixture(scope="module")
def photos(nsfw_run):
    name = input_specs(resolve_model(nsfw_run.path).path)[0].name
    return open_input_set("package:photos", load_pipeline(PIPELINE).preprocess, name).subset(0, SAMPLES)


@pytest.fixture(scope="module")
def results(nsfw_run, photos) -> dict[str, QuantErrorResult]:
    return {level: quantization_error(nsfw_run.path, photos, ExecutionOptions(graph_optimization_level=level))
            for level in ("disable", "all")}


def _sqnr(x: list[np.ndarray], y: list[np.ndarray]) -> float:
    return qdq_loss_debug.compute_signal_to_quantization_noice_ratio(x, y)


def test_ranking_is_worst_first_and_faithful(nsfw_run, results):
    for result in results.values():
        assert result.faithful and result.passed and result.samples == SAMPLES
        sqnr = [e.sqnr_db for e in result.tensors]
        assert sqnr == sorted(sqnr) and len(sqnr) >= 60
        assert [e.tensor for e in result.outputs] == ["prob"]
    # the input's own quantization, observable where ORT does not fold it into the first QLinearConv
    data = next(e for e in results["disable"].tensors if e.tensor == "data_input")
    assert data.op_type == "input" and data.position == -1 and data.added_db is None and data.how == "DequantizeLinear output"
    assert "data_input" not in {e.tensor for e in results["all"].tensors}
    quantized = onnx.load(str(nsfw_run.path / "quantize" / "model.onnx"))
    inits = {i.name for i in quantized.graph.initializer}
    weights = sum(n.op_type == "DequantizeLinear" and n.input[0] in inits for n in quantized.graph.node)
    assert results["disable"].constants == weights == 108  # every dequantized weight and bias is left out
    assert results["all"].constants < weights  # ORT folds most of them into its QLinearConv kernels
    production = results["all"]
    assert {e.how for e in production.tensors} == {"DequantizeLinear output", "float", "dequantized", "dequantized, NHWC"}
    assert production.tensors[0].sqnr_db < production.tensors[-1].sqnr_db - 10


def test_matches_onnxruntime_qdq_loss_debug(nsfw_run, photos, results, tmp_path):
    """Level disable runs the QDQ graph as written: the tensors onnxruntime's qdq_loss_debug collects from its
    augmented copies (at its default, optimizations off) are the ones qconsist observed."""
    activations = {}
    for stage in ("optimize", "quantize"):
        augmented = tmp_path / f"{stage}.onnx"
        qdq_loss_debug.modify_model_output_intermediate_tensors(nsfw_run.path / stage / "model.onnx", augmented)
        activations[stage] = qdq_loss_debug.collect_activations(str(augmented), iter([photos.sample(i) for i in range(SAMPLES)]))
    matching = qdq_loss_debug.create_activation_matching(activations["quantize"], activations["optimize"])
    theirs = {name: error["xmodel_err"] for name, error in qdq_loss_debug.compute_activation_error(matching).items()
              if "xmodel_err" in error}
    ours = {e.tensor: e.sqnr_db for e in results["disable"].tensors if e.how == "DequantizeLinear output"}
    common = sorted(set(theirs) & set(ours))
    assert len(common) >= 50
    for name in common:
        assert ours[name] == pytest.approx(theirs[name], abs=1e-3), name


def _exposed(model: Path, names: list[str], level: str, scratch: Path) -> ort.InferenceSession:
    """The graph ORT runs at ``level``, saved by ORT, with ``names`` exposed, reloaded with optimizations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
    options.optimized_model_filepath = str(scratch)
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(scratch))
    graph.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names])
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(graph.SerializeToString(), plain, providers=["CPUExecutionProvider"])


def test_production_tensors_match_a_direct_computation(nsfw_run, photos, results, tmp_path):
    """At level all the quantized model runs fused QLinearConv kernels in NHWC: their uint8 outputs, dequantized
    with the scale and zero point the quantizer wrote (int8, shifted by 128 as ORT's S8→U8 rewrite does) and
    transposed back, against the float model's tensors."""
    result = results["all"]
    chosen = [e for e in result.tensors if e.how == "dequantized, NHWC"][:3]
    chosen += [e for e in result.tensors if e.how == "DequantizeLinear output"][:1]
    chosen += [e for e in result.tensors if e.how == "float"][:1]
    assert len(chosen) == 5
    # the input's own quantization, observable where ORT does not fold it into the first QLinearConv
    data = next(e for e in results["disable"].tensors if e.tensor == "data_input")
    assert data.op_type == "input" and data.position == -1 and data.added_db is None and data.how == "DequantizeLinear output"
    assert "data_input" not in {e.tensor for e in results["all"].tensors}
    quantized = onnx.load(str(nsfw_run.path / "quantize" / "model.onnx"))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in quantized.graph.initializer}
    qnode = {n.input[0]: n for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    q_session = _exposed(nsfw_run.path / "quantize" / "model.onnx", [e.observed for e in chosen], "all", tmp_path / "q.onnx")
    f_session = _exposed(nsfw_run.path / "optimize" / "model.onnx", [e.tensor for e in chosen], "disable", tmp_path / "f.onnx")
    floats, observed = {e.tensor: [] for e in chosen}, {e.tensor: [] for e in chosen}
    prob_f, prob_q = [], []
    for i in range(SAMPLES):
        sample = photos.sample(i)
        f_values = dict(zip(["prob", *[e.tensor for e in chosen]], f_session.run(["prob", *[e.tensor for e in chosen]], sample)))
        q_values = dict(zip(["prob", *[e.observed for e in chosen]], q_session.run(["prob", *[e.observed for e in chosen]], sample)))
        prob_f.append(f_values["prob"])
        prob_q.append(q_values["prob"])
        for e in chosen:
            value = q_values[e.observed]
            if e.how == "dequantized, NHWC":
                assert value.dtype == np.uint8
                node = qnode[e.tensor]
                scale, zero = inits[node.input[1]], inits[node.input[2]]
                assert zero.dtype == np.int8
                value = ((value.astype(np.float32) - 128 - zero.astype(np.float32)) * scale).transpose(0, 3, 1, 2)
            floats[e.tensor].append(f_values[e.tensor])
            observed[e.tensor].append(value)
    for e in chosen:
        assert e.sqnr_db == pytest.approx(_sqnr(floats[e.tensor], observed[e.tensor]), abs=1e-3), e.tensor
        assert e.max_abs == pytest.approx(max(float(np.abs(a - b).max()) for a, b in zip(floats[e.tensor], observed[e.tensor])), rel=1e-6)
    final = result.outputs[0]
    assert final.sqnr_db == pytest.approx(_sqnr(prob_f, prob_q), abs=1e-3)
    assert final.max_abs == max(float(np.abs(a - b).max()) for a, b in zip(prob_f, prob_q))


def test_cli_prints_the_ranking_and_json(nsfw_run):
    out = CliRunner().invoke(app, ["quant-error", str(nsfw_run.path), "--inputs", "package:photos", "--count", "2", "--top", "5"])
    assert out.exit_code == 0, out.output
    assert "quantize (cpu, level all) against optimize (cpu, level disable), 2 samples" in out.output
    assert "final output prob: SQNR" in out.output and "cost:" in out.output
    json_out = CliRunner().invoke(app, ["quant-error", str(nsfw_run.path), "--count", "2", "--json"])
    assert json_out.exit_code == 0, json_out.output
    data = loads(json_out.output)
    assert data["schema"] == "qconsist.quant-error/1" and data["passed"] is True and data["samples"] == 2
    assert encode(QuantErrorResult.from_json(data).to_json()) == encode(data)
    top = data["tensors"][0]
    assert top["node"] in out.output and isinstance(top["sqnr_db"], float)


def test_a_stage_without_quantized_nodes_is_refused(nsfw_run):
    out = CliRunner().invoke(app, ["quant-error", str(nsfw_run.path), "--stage", "optimize", "--count", "1"])
    assert out.exit_code == 2
    assert out.output.strip() == f"error: the optimize model of {nsfw_run.path} has no quantized node: nothing to compare"
    bad = CliRunner().invoke(app, ["quant-error", str(nsfw_run.path), "--sort", "size"])
    assert (bad.exit_code, bad.output) == (2, "error: --sort must be sqnr or added, got 'size'\n")


def test_weights_match_onnxruntime_create_weight_matching(nsfw_run, results):
    """Every dequantized weight and bias, against onnxruntime's own weight matching of the two model files."""
    matching = qdq_loss_debug.create_weight_matching(str(nsfw_run.path / "optimize" / "model.onnx"),
                                                     str(nsfw_run.path / "quantize" / "model.onnx"))
    theirs = qdq_loss_debug.compute_weight_error(matching)
    ours = {w.tensor: w for w in results["all"].weights}
    assert set(ours) == set(theirs) and len(ours) == 108  # 53 weights, 53 biases, the Gemm's two
    for name, error in ours.items():
        # an int32 bias: onnxruntime's helper dequantizes in float64, DequantizeLinear (and qconsist) in float32
        wide = matching[name]["dequantized"].dtype == np.float64
        assert error.sqnr_db == pytest.approx(theirs[name], abs=1e-2 if wide else 1e-3), name
        dequantized = matching[name]["dequantized"].astype(np.float32)  # as DequantizeLinear gives it
        greatest = float(np.abs(matching[name]["float"] - dequantized).max())
        assert error.max_abs == pytest.approx(greatest, rel=1e-5, abs=1e-12), name
    assert [w.sqnr_db for w in results["all"].weights] == sorted(w.sqnr_db for w in results["all"].weights)
    conv = ours["ConvBnFusion_W_conv_1_W"]
    assert (conv.node, conv.op_type, conv.how, conv.elements) == ("conv_1", "Conv", "constant, per channel", 64 * 3 * 7 * 7)
