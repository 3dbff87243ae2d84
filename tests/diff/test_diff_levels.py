"""qconsist diff on a real divergence: open_nsfw QDQ at optimization level disable vs extended (QDQ fusion
into QLinearConv), checked against an independent computation with plain onnxruntime sessions and numpy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.compare import HISTOGRAM_LIMIT
from qconsist.diff import DiffResult, diff_runs
from qconsist.store.serde import encode, loads
from qconsist.inference.model import resolve_model


def _session(model_bytes_or_path, level):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    return ort.InferenceSession(model_bytes_or_path, so, providers=["CPUExecutionProvider"])


def _all_tensors(model: onnx.ModelProto, x: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Every node output of ``model`` for every sample, run with optimizations off."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    names = [o for n in exposed.graph.node for o in n.output if o]
    exposed.graph.output.extend(onnx.ValueInfoProto(name=o) for o in names if o not in have)
    sess = _session(exposed.SerializeToString(), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    feed = sess.get_inputs()[0].name
    out: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for i in range(x.shape[0]):
        for name, value in zip(names, sess.run(names, {feed: x[i : i + 1]})):
            out[name].append(value)
    return out


@pytest.fixture(scope="module")
def independent(nsfw_run, nsfw_inputs, tmp_path_factory):
    """First diverging tensor and origin tensors, computed without qconsist."""
    path = resolve_model(nsfw_run.path).path
    original = onnx.load(str(path))
    saved = tmp_path_factory.mktemp("independent") / "extended.onnx"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(saved)
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.load(nsfw_inputs)
    a = _all_tensors(original, x)
    b = _all_tensors(onnx.load(str(saved)), x)
    common = [n for n in a if n in b and a[n][0].dtype == b[n][0].dtype and a[n][0].shape == b[n][0].shape]
    differs = {n: [not np.array_equal(p, q) for p, q in zip(a[n], b[n])] for n in common}
    producer = {o: node for node in original.graph.node for o in node.output}
    inits = {i.name for i in original.graph.initializer}

    def nearest(tensor):
        """(observed tensors upstream, whether a tensor in between was not observed in both runs)"""
        found, hidden = set(), False
        for inp in producer[tensor].input:
            if not inp or inp in inits or inp not in producer:
                continue
            if inp in differs:
                found.add(inp)
            else:
                more, _ = nearest(inp)
                found, hidden = found | more, True
        return found, hidden

    diverging = [n for n in common if any(differs[n])]
    origins, spans = [], []
    for n in diverging:
        ins, hidden = nearest(n)
        if any(d and not any(differs[i][s] for i in ins) for s, d in enumerate(differs[n])):
            (spans if hidden else origins).append(n)
    return {"first": diverging[0], "origins": origins, "spans": spans, "diverging": diverging, "a": a, "b": b}


def test_first_and_origin_nodes_match_an_independent_computation(level_runs, independent):
    result = diff_runs(level_runs["disable"], level_runs["extended"])
    assert not result.passed
    tensors = result.tensors
    assert tensors.space == "original"
    assert tensors.first.key == independent["first"]
    assert [n.key for n in tensors.origins] == independent["origins"]
    assert [n.key for n in tensors.spans] == independent["spans"]
    assert sorted(n.key for n in tensors.nodes) == sorted(independent["diverging"])
    assert len(independent["origins"]) + len(independent["spans"]) >= 1
    # the first conv of open_nsfw is the first node fused into QLinearConv: it is the first divergence, named
    # after the original Conv node; the tensors inside the fusion were not observed at level extended, so it is a
    # span, never an origin whose inputs "are bit-identical" (issue 27 item 1)
    assert tensors.first.label == "conv_1"
    assert tensors.first.finding == "span" and "conv_1" in tensors.first.span


def test_element_statistics_of_the_first_conv_match_numpy(level_runs, independent):
    result = diff_runs(level_runs["disable"], level_runs["extended"])
    first = result.tensors.first
    a = np.concatenate([v.ravel() for v in independent["a"][first.key]])
    b = np.concatenate([v.ravel() for v in independent["b"][first.key]])
    assert first.elements is not None
    assert first.elements.differing == int((a != b).sum()) > 0
    assert first.elements.elements == a.size
    assert first.elements.max_abs == float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
    if a.dtype.kind == "f":
        ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)  # all >= 0 after Relu
        assert first.elements.max_ulp == int(np.abs(ia - ib).max())
    else:
        steps, counts = np.unique(b.astype(np.int64) - a.astype(np.int64), return_counts=True)
        clipped = np.clip(steps, -HISTOGRAM_LIMIT - 1, HISTOGRAM_LIMIT + 1)
        expected: dict[str, int] = {}
        for s, c in zip(clipped, counts):
            if s:
                key = f">+{HISTOGRAM_LIMIT}" if s > HISTOGRAM_LIMIT else f"<-{HISTOGRAM_LIMIT}" if s < -HISTOGRAM_LIMIT else f"{s:+d}"
                expected[key] = expected.get(key, 0) + int(c)
        assert first.elements.histogram == expected


def test_final_outputs_greatest_difference_and_top1(level_runs, independent):
    result = diff_runs(level_runs["disable"], level_runs["extended"])
    a, b = independent["a"]["prob"], independent["b"]["prob"]
    assert result.outputs.greatest_abs == max(float(np.abs(p - q).max()) for p, q in zip(a, b))
    agree = np.mean([np.argmax(p) == np.argmax(q) for p, q in zip(a, b)])
    assert result.top1_agreement == agree  # prob: class scores


def test_cli_reports_divergence_with_exit_1(level_runs):
    out = CliRunner().invoke(app, ["diff", str(level_runs["disable"]), str(level_runs["extended"])])
    assert out.exit_code == 1, out.output
    assert "first diverging node: conv_1" in out.output
    assert "options differ: graph_optimization_level: 'disable' -> 'extended'" in out.output
    assert "verdict: diverged" in out.output
    data = loads(CliRunner().invoke(app, ["diff", "--json", str(level_runs["disable"]), str(level_runs["extended"])]).output)
    assert data["schema"] == "qconsist.diff/1" and data["passed"] is False
    assert data["tensors"]["first"] == "conv_1"
    assert encode(DiffResult.from_json(data)) == encode(data)


def test_missing_raw_tensors_name_the_capture_command(level_runs, nsfw_run, nsfw_inputs):
    from qconsist.diff import capture_command
    from qconsist.store.run import Run

    result = diff_runs(level_runs["disable"], level_runs["extended"])
    assert result.tensors.raw_missing == [] and result.capture == []  # the first conv's raw tensors were kept
    command = capture_command(Run.open(level_runs["disable"]), ["relu_1_QuantizeLinear_Output", "prob"])
    assert command == (
        f"qconsist run {nsfw_run.path.resolve()} --stage quantize --inputs {nsfw_inputs.resolve()} --ep cpu --level disable "
        "--offset 0 --count 4 --dump --raw relu_1_QuantizeLinear_Output,prob"
    )


def test_identical_runs_exit_0_without_origin(level_runs):
    result = diff_runs(level_runs["extended"], level_runs["extended2"])
    assert result.passed and bool(result)
    assert result.tensors.nodes == [] and result.tensors.compared > 50
    out = CliRunner().invoke(app, ["diff", str(level_runs["extended"]), str(level_runs["extended2"])])
    assert out.exit_code == 0, out.output
    assert "all bit-identical in 4 samples" in out.output
    assert out.output.rstrip().endswith("verdict: identical")


def test_runs_from_another_onnxruntime_are_flagged_first(level_runs, tmp_path):
    """Identical tensors, but B's manifest says another onnxruntime and TF32 override: diff says it loudly,
    at the top, and records it in the result."""
    import shutil

    copy = tmp_path / "other-env"
    shutil.copytree(level_runs["extended2"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["environment"]["onnxruntime_module"] = "1.27.0"
    manifest["environment"]["packages"]["onnxruntime"] = "1.27.0"
    manifest["environment"]["env"]["NVIDIA_TF32_OVERRIDE"] = "0"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = diff_runs(level_runs["extended"], copy)
    assert [str(c) for c in result.versions.numerics] == [
        f"onnxruntime: {ort.__version__} (onnxruntime) -> 1.27.0 (onnxruntime)", "NVIDIA_TF32_OVERRIDE: absent -> 0"]
    assert DiffResult.from_json(result.to_json()).versions == result.versions
    out = CliRunner().invoke(app, ["diff", str(level_runs["extended"]), str(copy)])
    lines = out.stdout.splitlines()
    assert lines[2:5] == [
        "WARNING: the runs ran with different versions of what decides the numerics (a common cause of other "
        "results on the same model):",
        f"  onnxruntime: {ort.__version__} (onnxruntime) -> 1.27.0 (onnxruntime)",
        "  NVIDIA_TF32_OVERRIDE: absent -> 0",
    ]
