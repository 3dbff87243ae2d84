"""The origin rule as a proof, on models built in code (issue 27, items 1 and 2): `diff` of levels all against
disable names an origin only where every input the node reads was observed in both runs and is identical, and a
span — its nearest observed inputs identical, its output different, every node inside listed — where ORT fused
the inputs away; constants ORT stores in another shape are compared by value. Every finding is checked
independently on the raw tensors (``findings.check_findings``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from findings import check_findings
from origin_models import float_conv_chain, per_channel_affine_model, qdq_conv_chain
from qconsist.cli import app
from qconsist.diff import DiffResult, diff_runs
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline
from qconsist.store.serde import loads

SAMPLES = 3


def _dumps(model: Path, arrays: Path, folder: Path) -> dict[str, Path]:
    inputs = open_input_set(str(arrays), None, "x")
    return {level: run_inference(resolve_model(model), inputs, RunRequest(ExecutionOptions(graph_optimization_level=level),
                                                                          dump=True, raw=RawSelection.parse("all")),
                                 folder / "runs", run_id=level).run_dir for level in ("all", "disable")}


@pytest.fixture(scope="module")
def qdq_chain(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("qdq-chain")
    model = qdq_conv_chain(folder / "chain.onnx")
    np.save(folder / "x.npy", np.random.default_rng(5).uniform(-12, 12, (SAMPLES, 8, 12, 12)).astype(np.float32))
    dumps = _dumps(model, folder / "x.npy", folder)
    return {"model": onnx.load(str(model)), "dumps": dumps, "diff": diff_runs(dumps["all"], dumps["disable"])}


@pytest.fixture(scope="module")
def float_chain(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("float-chain")
    model = float_conv_chain(folder / "chain.onnx")
    np.save(folder / "x.npy", np.random.default_rng(0).normal(0, 1, (SAMPLES, 3, 16, 16)).astype(np.float32))
    dumps = _dumps(model, folder / "x.npy", folder)
    return {"model": onnx.load(str(model)), "dumps": dumps, "diff": diff_runs(dumps["all"], dumps["disable"])}


@pytest.fixture(scope="module")
def reshaped_constants(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("per-channel")
    per_channel_affine_model(folder / "model.onnx")
    np.save(folder / "x.npy", np.random.default_rng(0).normal(0, 1, (SAMPLES, 3, 10, 10)).astype(np.float32))
    config = parse_pipeline({"name": "affine", "model": {"onnx": str(folder / "model.onnx")},
                             "calibration": {"data": str(folder / "x.npy")}, "quantize": {"format": "QDQ"}}, folder / "p.toml")
    run = run_pipeline(config, runs_dir=folder / "runs", run_id="pipeline").path
    dumps = _dumps(run, folder / "x.npy", folder)
    return {"model": onnx.load(str(resolve_model(run).path)), "dumps": dumps, "diff": diff_runs(dumps["all"], dumps["disable"])}


def test_a_fused_qdq_conv_is_a_span_not_an_origin(qdq_chain):
    """At level all the first Conv, its input's DequantizeLinear, its weights' and its QuantizeLinear are one
    NHWC QLinearConv: none of their tensors is observed. Today's main named conv0 an origin "inputs bit-identical"
    (its nearest observed input x_q is identical); it is a span of those five nodes."""
    tensors = qdq_chain["diff"].tensors
    assert tensors.space == "original" and tensors.origins == []
    assert [n.label for n in tensors.nodes] == ["conv0", "conv1", "c1_DequantizeLinear"]
    (span,) = tensors.spans
    assert span.label == "conv0" and span.key == "c0_q" and span.count == SAMPLES
    assert span.span == ["x_DequantizeLinear", "w0_DequantizeLinear", "b0_DequantizeLinear", "conv0", "c0_QuantizeLinear"]
    assert sorted(span.unobserved) == ["b0", "c0", "w0", "x_dq"]
    assert span.inputs == ["x_q"] and span.given == [] and span.initializers_changed == []
    assert sorted(span.constants) == ["b0_q", "b0_scale", "b0_zero", "w0_q", "w0_scale", "w0_zero", "x_scale", "x_zero", "y0_scale", "y0_zero"]
    # conv1 reads c0_q, which differs: it propagates
    assert not tensors.nodes[1].finding
    assert check_findings(qdq_chain["diff"], qdq_chain["dumps"]["all"], qdq_chain["dumps"]["disable"], qdq_chain["model"]) == {
        "origin": 0, "span": 1}


def test_the_cli_says_span_and_lists_the_nodes_never_inputs_bit_identical(qdq_chain):
    out = CliRunner().invoke(app, ["diff", str(qdq_chain["dumps"]["all"]), str(qdq_chain["dumps"]["disable"])])
    assert out.exit_code == 1, out.output
    assert "first diverging node: conv0; origin nodes: 0; spans: 1" in out.output
    assert "bit-identical (samples" not in out.output and "origin conv0" not in out.output
    text = " ".join(out.output.split())
    assert ("span ending at conv0: its output differs while its nearest observed inputs are identical (1 observed "
            "input(s) bit-identical (x_q); 10 constant(s) identical by value; samples [0, 1, 2]); not observed: ") in text
    assert ("nodes inside: x_DequantizeLinear, w0_DequantizeLinear, b0_DequantizeLinear, conv0, c0_QuantizeLinear") in text
    data = loads(CliRunner().invoke(app, ["diff", "--json", str(qdq_chain["dumps"]["all"]), str(qdq_chain["dumps"]["disable"])]).output)
    assert data["tensors"]["origins"] == [] and data["tensors"]["spans"] == ["conv0"]
    node = data["tensors"]["nodes"][0]
    assert node["finding"] == "span" and node["inputs"] == ["x_q"] and node["span"][-1] == "c0_QuantizeLinear"
    assert DiffResult.from_json(data).tensors.spans[0].span == node["span"]


def test_a_float_conv_chain_in_nchwc_blocks_is_a_span(float_chain):
    """Level all runs the three convs in NCHWc blocks: only y is observed in both runs. Today's main named the
    Identity 'out' an origin while its input (the last Relu's output) was never compared."""
    tensors = float_chain["diff"].tensors
    assert tensors.origins == [] and [n.label for n in tensors.nodes] == ["out"]
    (span,) = tensors.spans
    assert span.span == ["conv0", "relu0", "conv1", "relu1", "conv2", "relu2", "out"]
    assert span.inputs == [] and span.given == ["x"] and span.unobserved == ["r2", "c2", "r1", "c1", "r0", "c0"]
    assert span.elements is not None and span.elements.differing > 0
    assert check_findings(float_chain["diff"], float_chain["dumps"]["all"], float_chain["dumps"]["disable"], float_chain["model"]) == {
        "origin": 0, "span": 1}


def test_constants_ort_stores_in_another_shape_are_compared_by_value(reshaped_constants):
    """At level all the NHWC transformer stores the DequantizeLinear outputs of the (1, C, 1, 1) scale and shift
    as (1, 1, 1, C): the same values. Today's main named both DequantizeLinear nodes origins, every element
    mismatched, greatest difference inf."""
    diff = reshaped_constants["diff"]
    import json

    index = json.loads((reshaped_constants["dumps"]["all"] / "dump" / "index.json").read_text())
    shapes = index["shapes"]
    assert diff.tensors.space == "original" and diff.tensors.compared >= 7
    assert not any(n.label.startswith(("scale_", "shift_")) for n in diff.tensors.nodes)
    assert diff.passed, [n.label for n in diff.tensors.nodes]
    assert [1, 1, 1, 32] in shapes  # the re-shaped constant is there, and compared by value
    check_findings(diff, reshaped_constants["dumps"]["all"], reshaped_constants["dumps"]["disable"], reshaped_constants["model"])


def test_every_finding_of_open_nsfw_at_levels_all_and_disable_holds_on_raw_tensors(nsfw_run, nsfw_inputs, tmp_path_factory):
    """The property over a real model: every origin of `diff` of open_nsfw's quantized model at level all against
    disable has every input recorded in both runs and bit-identical, and every span identical boundary inputs."""
    from qconsist.inference.session import input_specs

    folder = tmp_path_factory.mktemp("nsfw-levels")
    source = resolve_model(nsfw_run.path)
    inputs = open_input_set(nsfw_inputs, None, input_specs(source.path)[0].name).subset(0, 2)
    dumps = {level: run_inference(source, inputs, RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True,
                                                             raw=RawSelection.parse("all")), folder, run_id=level).run_dir
             for level in ("all", "disable")}
    result = diff_runs(dumps["all"], dumps["disable"])
    assert result.tensors.space == "original" and result.tensors.layout_unknown == []
    checked = check_findings(result, dumps["all"], dumps["disable"], onnx.load(str(source.path)))
    assert checked["origin"] + checked["span"] >= 1
    assert checked == {"origin": len(result.tensors.origins), "span": len(result.tensors.spans)}
    assert all(n.finding == "span" and n.unobserved for n in result.tensors.nodes if n.finding and not n.inputs)


def test_the_html_report_lists_the_span_and_its_nodes(qdq_chain):
    from qconsist.report.html import divergence_section

    html = divergence_section(qdq_chain["diff"].to_json())
    assert "No origin node among the compared tensors." in html
    assert "<h2>Spans</h2>" in html and "<td><code>conv0</code></td>" in html
    assert "<code>x_DequantizeLinear, w0_DequantizeLinear, b0_DequantizeLinear, conv0, c0_QuantizeLinear</code>" in html
