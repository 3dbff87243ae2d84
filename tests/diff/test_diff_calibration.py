"""qconsist diff on a real divergence: two open_nsfw pipeline runs calibrated on different photo subsets.

Pipeline vs pipeline (artifacts, calibration tables), their quantized models' ``--dump`` inference runs on
the same evaluation photos (first diverging node, origin nodes), and a pipeline run vs an inference run.
Every reported fact is checked against an independent computation with onnx, onnxruntime and numpy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.diff import DiffResult, diff_runs
from qconsist.store.serde import encode, loads
from qconsist.errors import RunStoreError

OPEN_NSFW_PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"


def _model(run: Path, stage: str) -> onnx.ModelProto:
    return onnx.load(str(Path(run) / stage / "model.onnx"))


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _floats(value) -> np.ndarray:
    """A calibration-table scale (a number, "nan"/"inf" string, or a list of them) as float64."""
    return np.asarray([float(v) for v in value] if isinstance(value, list) else [float(value)], dtype=np.float64)


@pytest.fixture(scope="module")
def pipeline_diff(calibration_runs) -> DiffResult:
    return diff_runs(calibration_runs["pipeline_a"], calibration_runs["pipeline_b"])


@pytest.fixture(scope="module")
def quantized(calibration_runs) -> dict:
    """Independently: the quantized models' initializers that differ, the scale and zero-point inputs
    of their Q/DQ nodes, and the nodes consuming each initializer."""
    a, b = _model(calibration_runs["pipeline_a"], "quantize"), _model(calibration_runs["pipeline_b"], "quantize")
    inits_a, inits_b = _initializers(a), _initializers(b)
    changed = {n for n in inits_a if n in inits_b and not _same(inits_a[n], inits_b[n])}
    qparams = {
        node.input[i] for node in b.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")
        for i in (1, 2) if len(node.input) > i
    }
    consumers: dict[str, list[str]] = {}
    for node in b.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)
    return {"a": inits_a, "b": inits_b, "changed": changed, "qparams": qparams, "consumers": consumers}


def test_pipeline_runs_first_differ_at_quantize(calibration_runs, pipeline_diff):
    stages = {s.name: s for s in pipeline_diff.artifacts.stages}
    assert list(stages) == ["convert", "optimize", "quantize"]
    assert pipeline_diff.artifacts.first_differing_stage == "quantize"
    assert not pipeline_diff.passed
    # independently: convert and optimize compute the same thing in both runs (same nodes, same weights)
    for stage in ("convert", "optimize"):
        a, b = _model(calibration_runs["pipeline_a"], stage), _model(calibration_runs["pipeline_b"], stage)
        assert [n.SerializeToString() for n in a.graph.node] == [n.SerializeToString() for n in b.graph.node]
        inits_a, inits_b = _initializers(a), _initializers(b)
        assert inits_a.keys() == inits_b.keys() and all(_same(inits_a[n], inits_b[n]) for n in inits_a)
        assert stages[stage].same_computation is True
        if not stages[stage].same_bytes:  # the bytes differ only in metadata, and the diff says which
            assert stages[stage].metadata, stages[stage]
            assert a.SerializeToString() != b.SerializeToString()
    assert stages["quantize"].same_computation is False


def test_changed_scales_and_their_consumers_match_the_models(pipeline_diff, quantized):
    changes = pipeline_diff.artifacts.stage("quantize").changes
    assert changes.nodes_added == changes.nodes_removed == changes.attributes_changed == ()
    reported = {c.name: c for c in changes.initializers_changed}
    assert set(reported) == quantized["changed"]
    scales = {n for n, c in reported.items() if c.quantization_parameter}
    assert scales == quantized["changed"] & quantized["qparams"]
    assert "relu_1_scale" in scales  # the first conv's output range depends on the calibration photos
    for name, change in reported.items():
        a, b = quantized["a"][name], quantized["b"][name]
        assert list(change.consumers) == quantized["consumers"][name]
        assert change.elements_changed == int((a.astype(np.float64) != b.astype(np.float64)).sum()) > 0
        assert change.elements == a.size


def test_calibration_differences_match_the_ranges_and_scales(calibration_runs, pipeline_diff, quantized):
    calib = pipeline_diff.calibration
    assert calib.compared and calib.only_a == calib.only_b == []
    table = json.loads((Path(calibration_runs["pipeline_b"]) / "manifest.json").read_text())["calibration"]["table"]
    ranges = {}
    for key in ("a", "b"):
        data = json.loads((Path(calibration_runs[f"pipeline_{key}"]) / "quantize" / "calibration_ranges.json").read_text())
        ranges[key] = {t: (v["lowest"]["data"], v["highest"]["data"]) for t, v in data["data"].items()}
    expected = set()
    for tensor, entry in table.items():
        params = [entry["scale_initializer"], entry.get("zero_point_initializer")]
        if any(p in quantized["changed"] for p in params if p) or ranges["a"].get(tensor) != ranges["b"].get(tensor):
            expected.add(tensor)
    assert {c.tensor for c in calib.changed} == expected and len(expected) > 10
    for change in calib.changed:
        scale_b = quantized["b"][table[change.tensor]["scale_initializer"]].astype(np.float64).ravel()
        assert np.array_equal(_floats(change.b["scale"]), scale_b, equal_nan=True)
        assert ("scale" in change.fields) == (table[change.tensor]["scale_initializer"] in quantized["changed"])


def test_cli_diff_of_pipeline_runs(calibration_runs, pipeline_diff):
    a, b = str(calibration_runs["pipeline_a"]), str(calibration_runs["pipeline_b"])
    out = CliRunner().invoke(app, ["diff", a, b])
    assert out.exit_code == 1, out.output
    assert "artifacts: first differing stage: quantize" in out.output
    assert f"calibration: {len(pipeline_diff.calibration.changed)} tensor(s) changed range or scale" in out.output
    assert out.output.rstrip().endswith("verdict: diverged")
    for stage in pipeline_diff.artifacts.stages:
        if not stage.same_bytes and stage.same_computation:
            assert f"  {stage.name}: bytes differ, computation identical (" in out.output
    data = loads(CliRunner().invoke(app, ["diff", "--json", a, b]).output)
    assert data["artifacts"]["first_differing_stage"] == "quantize" and data["tensors"] is None
    assert encode(DiffResult.from_json(data)) == encode(data)


# --- the two quantized models run with --dump on the same evaluation photos --------------------------------


def _exposed_run(model_path: Path, saved: Path, samples: list[dict]) -> tuple[onnx.ModelProto, list[dict]]:
    """ORT's optimized graph (level all, CPU) with every node output exposed, run with optimizations off:
    every tensor of every sample, by name."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(saved)
    ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(saved))
    exposed = onnx.ModelProto()
    exposed.CopyFrom(graph)
    names = [o for n in exposed.graph.node for o in n.output if o]
    have = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.ValueInfoProto(name=o) for o in names if o not in have)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(exposed.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return graph, [dict(zip(names, sess.run(names, s))) for s in samples]


@pytest.fixture(scope="module")
def independent(calibration_runs, tmp_path_factory) -> dict:
    """First diverging tensor and origin tensors of the two quantized models, computed without qconsist."""
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    folder = tmp_path_factory.mktemp("independent-calibration")
    graphs, tensors, production = {}, {}, {}
    for key in ("a", "b"):
        path = Path(calibration_runs[f"pipeline_{key}"]) / "quantize" / "model.onnx"
        name = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()[0].name
        photos = open_input_set("package:photos", load_pipeline(OPEN_NSFW_PIPELINE).preprocess, name)
        offset, count = calibration_runs["evaluation"]
        samples = [photos.sample(offset + i) for i in range(count)]
        graphs[key], tensors[key] = _exposed_run(path, folder / f"{key}.onnx", samples)
        plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        production[key] = [plain.run(None, s)[0] for s in samples]
    graph = graphs["a"].graph
    order = [o for n in graph.node for o in n.output if o]
    differs = {t: [not _same(sa[t], sb[t]) for sa, sb in zip(tensors["a"], tensors["b"])] for t in order}
    producer = {o: node for node in graph.node for o in node.output if o}
    inits_a, inits_b = _initializers(graphs["a"]), _initializers(graphs["b"])
    origins, changed_inits = [], {}
    for t in order:
        inputs = [i for i in producer[t].input if i in producer]  # activations: graph inputs are the same photos
        if any(d and not any(differs[i][s] for i in inputs) for s, d in enumerate(differs[t])):
            origins.append(t)
            changed_inits[t] = sorted(i for i in producer[t].input if i in inits_a and not _same(inits_a[i], inits_b[i]))
    diverging = [t for t in order if any(differs[t])]
    return {
        "first": diverging[0], "origins": origins, "diverging": diverging, "changed_inits": changed_inits,
        "production": production,
    }


@pytest.fixture(scope="module")
def inference_diff(calibration_runs) -> DiffResult:
    return diff_runs(calibration_runs["inference_a"], calibration_runs["inference_b"])


def test_first_diverging_and_origin_nodes_match_an_independent_computation(inference_diff, independent, calibration_runs):
    assert inference_diff.artifacts.first_differing_stage == "quantize"
    tensors = inference_diff.tensors
    assert tensors.space == "optimized"  # same fused graph, other scale values
    assert tensors.first.key == independent["first"]
    assert [n.key for n in tensors.origins] == independent["origins"]
    assert [n.key for n in tensors.nodes] == independent["diverging"]
    for node in tensors.origins:
        assert node.initializers_changed == independent["changed_inits"][node.key]
        assert node.initializers_changed  # inputs identical, outputs differ: new scales or weights
    # the first divergence is named after the original model's node: the first Conv, run as a QLinearConv
    original = {n.name: n for n in _model(calibration_runs["pipeline_a"], "quantize").graph.node}
    assert original[tensors.first.label].op_type == "Conv"
    assert tensors.first.op_a == tensors.first.op_b == "com.microsoft:QLinearConv"  # ORT's NHWC kernel
    assert tensors.first.origin and "relu_1_scale" in tensors.first.initializers_changed


def test_final_outputs_and_capture_commands(inference_diff, independent, calibration_runs):
    a, b = independent["production"]["a"], independent["production"]["b"]
    outputs = inference_diff.outputs
    assert outputs.differing_samples == [i for i, (p, q) in enumerate(zip(a, b)) if not _same(p, q)]
    assert outputs.greatest_abs == max(float(np.abs(p.astype(np.float64) - q).max()) for p, q in zip(a, b))
    assert inference_diff.top1_agreement == np.mean([np.argmax(p) == np.argmax(q) for p, q in zip(a, b)])  # prob: class scores
    # no raw tensors were kept: the diff names them and the commands that capture them
    key_nodes = [n.key for n in inference_diff.tensors.nodes if n.origin or n is inference_diff.tensors.first]
    assert inference_diff.tensors.raw_missing == key_nodes
    assert inference_diff.capture[0].startswith(f"qconsist run {calibration_runs['pipeline_a']} --stage quantize ")
    assert inference_diff.capture[1].startswith(f"qconsist run {calibration_runs['pipeline_b']} --stage quantize ")
    assert all(c.endswith("--dump --raw " + ",".join(key_nodes)) for c in inference_diff.capture)
    out = CliRunner().invoke(app, ["diff", str(calibration_runs["inference_a"]), str(calibration_runs["inference_b"])])
    assert out.exit_code == 1, out.output
    assert f"first diverging node: {inference_diff.tensors.first.label}" in out.output
    assert "element statistics need raw tensors; capture them with:" in out.output


# --- a pipeline run vs an inference run ----------------------------------------------------------------------


def test_pipeline_run_vs_inference_run_of_the_other_model(calibration_runs, pipeline_diff):
    result = diff_runs(calibration_runs["pipeline_a"], calibration_runs["inference_b"])
    assert not result.passed and result.tensors is None and result.outputs is None
    assert result.artifacts.first_differing_stage == "quantize"
    quantize = result.artifacts.stage("quantize")
    expected = pipeline_diff.artifacts.stage("quantize")
    assert quantize.changes == expected.changes  # the inference run records the model it ran
    assert result.calibration == pipeline_diff.calibration
    assert result.notes == ["a pipeline run and an inference run: artifacts and calibration compared"]
    out = CliRunner().invoke(app, ["diff", str(calibration_runs["pipeline_a"]), str(calibration_runs["inference_b"])])
    assert out.exit_code == 1, out.output
    assert "artifacts: first differing stage: quantize" in out.output


def test_pipeline_run_vs_inference_run_of_its_own_model(calibration_runs):
    result = diff_runs(calibration_runs["pipeline_a"], calibration_runs["inference_a"])
    assert result.passed
    assert [s.same_bytes for s in result.artifacts.stages] == [True, True, True]
    assert result.calibration.compared and result.calibration.changed == []
    out = CliRunner().invoke(app, ["diff", str(calibration_runs["pipeline_a"]), str(calibration_runs["inference_a"])])
    assert out.exit_code == 0, out.output
    assert out.output.rstrip().endswith("verdict: identical")


def test_pipeline_run_vs_inference_run_of_an_unrelated_model(calibration_runs, small_models, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32))
    out = CliRunner().invoke(app, [
        "run", str(small_models["classifier"]), "--inputs", str(tmp_path / "x.npy"), "--runs-dir", "runs", "--run-id", "small",
    ])
    assert out.exit_code == 0, out.output
    with pytest.raises(RunStoreError, match=r"share no stage with a model \(convert, optimize, quantize vs model\)"):
        diff_runs(calibration_runs["pipeline_a"], "runs/small")
    out = CliRunner().invoke(app, ["diff", str(calibration_runs["pipeline_a"]), "runs/small"])
    assert out.exit_code == 2
    assert out.output == (
        f"error: runs share no stage with a model (convert, optimize, quantize vs model): {calibration_runs['pipeline_a']} "
        "is a pipeline run and runs/small an inference run; run the model from the pipeline's run directory "
        "(qconsist run RUN_DIR) to compare them\n"
    )
