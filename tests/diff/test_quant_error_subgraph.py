"""Subgraphs in quant-error (issue 27, item 5): the outer tensors an ``If``'s branches read are its inputs. ORT's
quantizer removes the Relu before the ``If`` and gives the Conv's output the Relu's name, so the branches of the
quantized model read the unrectified Conv output: quant-error shows that tensor (the one the branch computes
with), and the ``If`` loses no SQNR of its own — today's main showed neither the tensor (left out as internal)
nor a sane figure for the If (it "added" 39 dB, measured against its condition alone)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from origin_models import if_layernorm_model
from qconsist.diff.quantization import quantization_error
from qconsist.inference.model import resolve_model
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline


def _tensor(path, name: str, x: np.ndarray) -> np.ndarray:
    """``name`` of the model at ``path`` for every sample, exposed and run with optimizations off."""
    model = onnx.load(str(path))
    model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([name], {"x": x[i:i + 1]})[0] for i in range(len(x))])


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("if-subgraph")
    if_layernorm_model(folder / "model.onnx")
    np.save(folder / "x.npy", np.random.default_rng(5).normal(0, 1, (4, 8, 16)).astype(np.float32))
    config = parse_pipeline({"name": "gated", "model": {"onnx": str(folder / "model.onnx")}, "calibration": {"data": str(folder / "x.npy")},
                             "quantize": {"format": "QDQ"}}, folder / "p.toml")
    run = run_pipeline(config, runs_dir=folder / "runs", run_id="pipeline").path
    return {"run": run, "x": np.load(folder / "x.npy"),
            "result": quantization_error(run, open_input_set(str(folder / "x.npy"), None, "x"))}


def test_the_quantizer_renamed_the_tensor_the_branches_read(gated):
    quantized = onnx.load(str(resolve_model(gated["run"], "quantize").path))
    producer = {o: n for n in quantized.graph.node for o in n.output}
    assert producer["act"].op_type == "Conv" and not any(n.op_type == "Relu" for n in quantized.graph.node)
    branch_reads = {i for n in quantized.graph.node if n.op_type == "If" for a in n.attribute for m in a.g.node for i in m.input}
    assert branch_reads == {"act"}


def test_quant_error_shows_the_tensor_the_branch_reads(gated):
    result = gated["result"]
    rows = {e.tensor: e for e in [*result.tensors, *result.outputs]}
    act = rows["act"]
    assert (act.node, act.op_type, act.observed, act.how) == ("relu", "Relu", "act", "read by a subgraph")
    # independently: the float model's act (rectified) against the quantized model's act (the Conv's output)
    x = gated["x"]
    reference = _tensor(resolve_model(gated["run"], "optimize").path, "act", x).astype(np.float64)
    observed = _tensor(resolve_model(gated["run"], "quantize").path, "act", x).astype(np.float64)
    expected = 20 * math.log10(np.linalg.norm(reference) / np.linalg.norm(reference - observed))
    assert abs(act.sqnr_db - expected) < 0.05 and act.sqnr_db < 3
    # the If computes exactly from what its branches read: it loses nothing of its own (main: +39 dB "added")
    gate = rows["gated"]
    assert gate.op_type == "If" and gate.added_db is not None and gate.added_db < 0
    assert gate.added_db == pytest.approx(act.sqnr_db - gate.sqnr_db)
    assert "conv" not in result.internal


def test_inspect_counts_the_conv_the_branch_reads_as_float(gated):
    """The Conv's output goes to a QuantizeLinear and, read by the If's branches, as a float: it does not run
    quantized (main counted it quantized: 7 of 14, its only explicit consumer being the QuantizeLinear)."""
    from qconsist.inspect.model import summarize_model

    summary = summarize_model(resolve_model(gated["run"], "quantize").path)
    assert (summary.quantized_nodes, summary.computing_nodes) == (6, 14)
    assert "Conv ×1" in summary.not_quantized
