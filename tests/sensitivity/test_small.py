"""``qconsist sensitivity`` on models built in code: a classifier whose int8 quantization is good (40 dB) and can be
made better by keeping nodes in float, and a map head whose int8 quantization is destroyed (0 dB: an outlier
channel shares one scale with the channels that matter) and that no node kept in float fixes, but 16-bit
activations do. The verified numbers are checked against onnxruntime's quantize_static with the same
nodes_to_exclude and the same calibration inputs, the outputs compared here with numpy; and every error path."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from output_models import build_outlier_map_model, save_map_inputs
from qconsist.cli import app
from qconsist.errors import ConfigError, InputError, RunStoreError
from qconsist.locate.latency import LatencyOptions
from qconsist.inference.session import provider_available
from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.runner import run_pipeline
from qconsist.sensitivity import SensitivityRequest, SensitivityResult, Target, sensitivity
from qconsist.store.rundir import list_runs

FAST = LatencyOptions(warmup=0, runs=3)


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _write_pipeline(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("sensitivity-small")
    made = {"folder": folder, "runs": folder / "runs",
            "cls_model": build_classifier_model(folder / "cls.onnx"), "arrays": save_arrays(folder / "arrays.npy", 12, seed=2),
            "map_model": build_outlier_map_model(folder / "map.onnx"), "x": save_map_inputs(folder / "x.npy")}
    made["cls_toml"] = _write_pipeline(folder / "cls.toml", 'name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\n'
                                       'data = "arrays.npy"\ncount = 8\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    made["map_toml"] = _write_pipeline(folder / "map.toml", 'name = "map"\n[model]\nonnx = "map.onnx"\n[calibration]\n'
                                       'data = "x.npy"\n[evaluation]\noutputs = {map = "map"}\n')
    for name in ("cls", "map"):
        made[name] = run_pipeline(load_pipeline(made[f"{name}_toml"]), runs_dir=made["runs"], run_id=name).path
    return made


@pytest.fixture(scope="module")
def classifier(small, tmp_path_factory) -> tuple[SensitivityResult, Path]:
    request = SensitivityRequest(targets=(Target.parse("sqnr>=50"),), latency=FAST)
    return sensitivity(small["cls"], request, runs_dir=tmp_path_factory.mktemp("cls-sensitivity"), run_id="s")


def test_one_calibration_reproduces_the_run_and_every_node_is_probed(classifier):
    result, _ = classifier
    assert result.baseline_md5 == result.run_md5  # the recorded ranges re-make the run's own model, byte for byte
    assert result.quantizable == 6 and result.unnamed == 0 and result.strategy == "every quantizable node (6)"
    assert [(n.rank, n.node, n.op_type) for n in result.probed] == [
        (1, "softmax", "Softmax"), (2, "relu", "Relu"), (3, "conv", "Conv"), (4, "fc", "Gemm"), (5, "flatten", "Flatten"),
        (6, "gap", "GlobalAveragePool")]
    assert result.baseline.worst_sqnr_db == pytest.approx(40.19, abs=0.01)
    gains = {n.node: n.gain_db for n in result.probed}
    assert gains["softmax"] == pytest.approx(4.77, abs=0.01) and gains["fc"] == pytest.approx(0.42, abs=0.01)
    assert gains["flatten"] == gains["gap"] == 0.0  # nothing to gain: their tensors are quantized by their neighbours
    assert result.samples == 4 and (result.inputs["offset"], result.inputs["count"]) == (8, 4)
    assert result.agreement is not None and result.agreement.nodes == 6


def test_the_proposal_is_verified_through_the_quantize_stage(classifier):
    result, path = classifier
    p, v = result.proposal, result.verification
    assert p.reached and p.nodes == ["softmax", "fc"] and p.quantize_changes == {}
    assert [(s.action, s.node) for s in p.steps] == [("add", "softmax"), ("add", "relu"), ("add", "conv"), ("add", "fc"),
                                                     ("keep", "fc"), ("drop", "conv"), ("drop", "relu"), ("keep", "softmax")]
    assert v.reached and v.same_as_predicted and v.md5 == p.md5
    assert v.measured == p.predicted and v.measured.worst_sqnr_db == pytest.approx(52.80, abs=0.01)
    assert v.stage_failures == [] and v.stage_check["passed"] is True
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["kind"] == "sensitivity" and manifest["sections"]["sensitivity"]["proposal"] == ["softmax", "fc"]
    stage = manifest["stages"][0]
    assert stage["name"] == "quantize" and stage["params"]["nodes_to_exclude"] == ["softmax", "fc"]
    assert stage["artifact"]["md5"] == v.md5 and v.model == "quantize/model.onnx"
    assert hashlib.md5((path / v.model).read_bytes()).hexdigest() == v.md5
    assert result.latency is not None and result.latency.runs == 3 and result.latency.ratio > 0
    assert p.pipeline_lines([]) == ["[quantize]", 'nodes_to_exclude = ["softmax", "fc"]']
    assert result.cost.probes >= 8 and result.cost.sessions >= result.cost.probes and result.cost.seconds["total"] > 0
    assert set(result.cost.seconds) == {"first_pass", "probes", "search", "verify", "latency", "total"}


class CalibrationReader:
    """onnxruntime's CalibrationDataReader over stacked arrays, one sample at a time."""

    def __init__(self, name: str, samples: np.ndarray) -> None:
        self.items = iter([{name: s[None]} for s in samples])

    def get_next(self):
        return next(self.items, None)


def _sqnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    reference, candidate = reference.astype(np.float64), candidate.astype(np.float64)
    return float(20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - candidate)))


def test_against_onnxruntime_quantize_static_and_numpy(small, classifier, tmp_path):
    """The independent computation: quantize_static calibrating itself on the run's calibration arrays with the
    proposal's nodes_to_exclude, both models run by plain onnxruntime sessions, the SQNR computed here."""
    result, path = classifier
    float_model = small["cls"] / "optimize" / "model.onnx"
    arrays = np.load(small["arrays"])
    name = onnx.load(str(float_model)).graph.input[0].name
    independent = tmp_path / "independent.onnx"
    quantize_static(str(float_model), str(independent), CalibrationReader(name, arrays[:8]), quant_format=QuantFormat.QDQ,
                    per_channel=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=["softmax", "fc"], calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    assert hashlib.md5(independent.read_bytes()).hexdigest() == result.verification.md5
    sessions = [ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]) for m in (float_model, independent)]
    evaluation = arrays[8:]
    outputs = [np.concatenate([s.run(None, {name: x[None]})[0] for x in evaluation]) for s in sessions]
    # the same bytes, run by other sessions: the figure agrees to the summation order (NoiseStats sums per sample)
    assert result.verification.measured.outputs[0].sqnr_db == pytest.approx(_sqnr(*outputs), rel=1e-7)
    assert result.verification.measured.outputs[0].max_abs == pytest.approx(float(np.abs(outputs[0] - outputs[1]).max()), rel=1e-6)
    agree = float(np.mean(outputs[0].argmax(axis=1) == outputs[1].argmax(axis=1)))
    assert result.verification.measured.top1_agreement == agree == 1.0


def test_cli_prints_the_lines_to_paste_and_they_reproduce_the_verified_model(small, tmp_path):
    result = _invoke("sensitivity", small["cls"], "--target", "sqnr>=50", "--timed-runs", "3", "--warmup", "0",
                     "--run-id", "cli")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == ("sensitivity of " + str(small["cls"]) + " (cls): quantize from optimize, probes on cpu level all, "
                        "4 samples (" + str(small["arrays"]) + ")")
    assert lines[1].startswith("all quantized (re-made from the run's recorded ranges: md5 ") and lines[1].endswith(
        ", the run's own): prob (class-scores) 40.2 dB, top-1 agreement 100.0%")
    assert "proposal for sqnr>=50: keep 2 node(s) in float" in lines
    at = lines.index("in the pipeline file:")
    assert lines[at + 1:at + 3] == ["  [quantize]", '  nodes_to_exclude = ["softmax", "fc"]']
    verified = next(line for line in lines if line.startswith("  verified:"))
    assert verified.startswith("  verified:  prob (class-scores) 52.8 dB, top-1 agreement 100.0% — reaches the targets "
                               "(re-made by the pipeline's quantize stage, calibration included: md5 ")
    assert verified.endswith(", identical to the model the search measured)")
    assert lines[-1] == "run cli: runs/cli"
    # pasted into the pipeline file, the lines give the verified model
    pasted = _write_pipeline(small["folder"] / "pasted.toml", small["cls_toml"].read_text() + "\n".join(lines[at + 1:at + 3]) + "\n")
    run = run_pipeline(load_pipeline(pasted), runs_dir=tmp_path / "runs", run_id="pasted")
    recorded = json.loads((Path("runs/cli") / "manifest.json").read_text())["stages"][0]["artifact"]["md5"]
    assert run.artifacts["quantize"].md5 == recorded
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert manifest["sections"]["pipeline"]["quantize"]["nodes_to_exclude"] == ["softmax", "fc"]
    assert _invoke("verify", "runs/cli").exit_code == 0


def test_json_is_the_schema_versioned_result(small):
    result = _invoke("sensitivity", small["cls"], "--target", "sqnr>=50", "--target", "top1>=1", "--timed-runs", "3",
                     "--candidates", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "qconsist.sensitivity/1" and data["passed"] is True
    assert [t["text"] for t in data["targets"]] == ["sqnr>=50", "top1>=1"]
    parsed = SensitivityResult.from_json(data)
    assert parsed.to_json() == SensitivityResult.from_json(json.loads(json.dumps(parsed.to_json()))).to_json()
    assert parsed.proposal.nodes == ["softmax", "fc"] and parsed.verification.reached
    # quant-error blames fc, then softmax: fc alone cannot reach 50 dB, so one more node is probed (widening by 1)
    assert [n.node for n in parsed.nodes if n.first_pass_rank in (1, 2)] == ["softmax", "fc"]
    assert parsed.strategy == ("the first pass's top 2 of 6 quantizable nodes (quant-error's ranking; widened 1 time(s) "
                               "by 1: the targets were not reached with fewer; --all probes every one)")
    with pytest.raises(RunStoreError, match=r"^sensitivity result schema 'qconsist.diff/1' is not 'qconsist.sensitivity/1'$"):
        SensitivityResult.from_json({**data, "schema": "qconsist.diff/1"})


def test_a_destroyed_map_is_fixed_by_16_bit_activations_not_by_float_nodes(small):
    result = _invoke("sensitivity", small["map"], "--target", "sqnr>=20", "--timed-runs", "3", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.output
    data = SensitivityResult.from_json(json.loads(result.stdout))
    assert data.baseline.worst_sqnr_db == pytest.approx(0.0, abs=0.05)
    assert all(n.gain_db == pytest.approx(0.0, abs=0.05) for n in data.probed)  # no node alone helps
    assert [(s.node, s.met) for s in data.alternatives] == [("activation_type = int16", True)]
    assert data.proposal.nodes == [] and data.proposal.quantize_changes == {"activation_type": "int16"}
    assert data.verification.reached and data.verification.measured.worst_sqnr_db == pytest.approx(27.0, abs=0.1)
    assert data.proposal.pipeline_lines([]) == ["[quantize]", 'activation_type = "int16"']


def test_a_target_not_reached_exits_1_and_says_so(small):
    result = _invoke("sensitivity", small["map"], "--target", "sqnr>=20", "--no-alternatives", "--timed-runs", "3")
    assert result.exit_code == 1, result.output
    assert "proposal for sqnr>=20: keep no node in float — DOES NOT reach the targets on the probe inputs" in result.stdout
    assert "— DOES NOT reach the targets (re-made by the pipeline's quantize stage" in result.stdout
    assert "in the pipeline file:" not in result.stdout


def test_rank_only_without_a_target(small):
    result = _invoke("sensitivity", small["cls"], "--json", "--candidates", "3")
    assert result.exit_code == 0
    data = SensitivityResult.from_json(json.loads(result.stdout))
    assert data.proposal is None and data.verification is None and data.passed
    assert len(data.probed) == 3 and len(data.nodes) == 6  # no widening without a target


def test_accuracy_with_labels(small, tmp_path):
    arrays = np.load(small["arrays"])[8:]
    session = ort.InferenceSession(str(small["cls"] / "optimize" / "model.onnx"), providers=["CPUExecutionProvider"])
    predicted = [int(session.run(None, {"x": x[None]})[0].argmax()) for x in arrays]
    labels = {"000008": predicted[0], "000009": (predicted[1] + 1) % 5, "000010": predicted[2], "000011": predicted[3]}
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(labels))
    result = _invoke("sensitivity", small["cls"], "--target", "accuracy-drop<=0", "--labels", path, "--json", "--candidates", "2")
    assert result.exit_code == 0, result.output
    data = SensitivityResult.from_json(json.loads(result.stdout))
    assert data.labels == 4 and data.baseline.float_accuracy == 0.75 and data.baseline.accuracy == 0.75
    assert data.baseline.accuracy_drop == 0.0 and data.proposal.nodes == [] and data.verification.reached


def test_report_of_a_sensitivity_run_and_of_its_json(small, classifier, tmp_path):
    _, path = classifier
    out = tmp_path / "report.html"
    assert _invoke("report", path, "-o", out).exit_code == 0
    html = out.read_text()
    assert "Sensitivity: which nodes to keep in float" in html and 'class="banner pass"' in html
    assert "nodes_to_exclude = [&quot;softmax&quot;, &quot;fc&quot;]" in html
    assert "<td>1</td><td><code>softmax</code></td><td>Softmax</td>" in html
    assert "verified (quantize stage)" in html and "Verified model" in html
    result = tmp_path / "result.json"
    result.write_text((path / "sensitivity.json").read_text())
    assert _invoke("report", result, "-o", tmp_path / "from-json.html").exit_code == 0
    assert "sensitivity of cls: the verified proposal reaches sqnr&gt;=50" in (tmp_path / "from-json.html").read_text()


# --- errors: one line, exit 2 (3 for a missing execution provider) -------------------------------------------------


def _error(result, line: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr == f"error: {line}\n"
    assert not Path("runs").exists() or [state for _, state in list_runs(Path("runs"))] == []


def test_bad_target(small):
    _error(_invoke("sensitivity", small["cls"], "--target", "sqnr<=40"), "target 'sqnr<=40': sqnr takes a lower bound: write sqnr>=40")
    _error(_invoke("sensitivity", small["cls"], "--target", "psnr>=40"),
           "target 'psnr>=40': unknown measure 'psnr' (measures: sqnr, cosine, max-abs, top1, accuracy-drop)")
    _error(_invoke("sensitivity", small["map"], "--target", "top1>=0.9"),
           "target top1>=0.9 needs a class-scores output, and the model has none declared or inferred (map: map); declare "
           "one in the pipeline's [evaluation] outputs, or use sqnr>=DB")
    _error(_invoke("sensitivity", small["cls"], "--target", "accuracy-drop<=0.1"),
           "target accuracy-drop<=0.1 needs labelled inputs: give --labels FILE (sample name -> class), or use top1>=X "
           "(agreement with the float model)")
    _error(_invoke("sensitivity", small["cls"], "--target", "sqnr[logits]>=40"),
           "target sqnr[logits]>=40: the model has no output or part 'logits' (its outputs and parts: prob)")


def test_an_inference_run_is_refused(small):
    made = _invoke("run", small["cls_model"], "--inputs", small["arrays"], "--run-id", "inference", "--runs-dir", "made")
    assert made.exit_code == 0
    _error(_invoke("sensitivity", "made/inference", "--target", "sqnr>=40"),
           "run made/inference is a(n) inference run: sensitivity needs a pipeline run (or a nightly entry), whose "
           "quantize stage it repeats with nodes kept in float")


def _edited(small, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(small["cls"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_run_without_a_quantize_stage_or_its_ranges_is_refused(small, tmp_path):
    copy = _edited(small, tmp_path, lambda m: m.update(stages=[s for s in m["stages"] if s["name"] != "quantize"]))
    _error(_invoke("sensitivity", copy), f"run {copy} has no quantize stage (stages: convert, optimize): sensitivity needs "
                                         "a pipeline run that quantized its model")
    shutil.rmtree(copy)
    copy = _edited(small, tmp_path, lambda m: m["calibration"].pop("ranges_file"))
    _error(_invoke("sensitivity", copy), f"run {copy} does not record its calibration ranges (quantize/calibration_ranges.json): "
                                         "run the pipeline again with this qconsist, which records them")


def test_a_sensitivity_run_is_refused_naming_its_pipeline_run(small, classifier):
    _, path = classifier
    with pytest.raises(RunStoreError, match=r"is a\(n\) sensitivity run: .* \(this one was made from .*/runs/cls\)$"):
        sensitivity(path)


def test_unknown_nodes_to_exclude_in_the_pipeline(small, tmp_path):
    pipeline = _write_pipeline(tmp_path / "p.toml", small["cls_toml"].read_text().replace("data = \"arrays.npy\"", f"data = \"{small['arrays']}\"")
                               .replace('onnx = "cls.onnx"', f'onnx = "{small["cls_model"]}"') + '[quantize]\nnodes_to_exclude = ["softmax", "nope"]\n')
    _error(_invoke("pipeline", "run", pipeline), "quantize.nodes_to_exclude: the model to quantize has no node named nope "
                                                 "(its nodes: conv, relu, gap, flatten, fc, softmax)")


def test_option_errors(small, tmp_path):
    _error(_invoke("sensitivity", small["cls"], "--pipeline", small["cls_toml"]),
           "--pipeline prepares the images of --inputs: give --inputs too (without it, the run's own evaluation "
           "inputs are used, prepared as the run prepared them)")
    _error(_invoke("sensitivity", small["cls"], "--labels", tmp_path / "none.json"), f"labels file {tmp_path / 'none.json'} does not exist")
    (tmp_path / "other.json").write_text('{"elsewhere.png": 1}')
    _error(_invoke("sensitivity", small["cls"], "--labels", tmp_path / "other.json"),
           "no sample of the inputs has a label (the labels name other samples; the inputs' samples: 000008, 000009, 000010, …)")
    (tmp_path / "bad.json").write_text('[1, 2]')
    _error(_invoke("sensitivity", small["cls"], "--labels", tmp_path / "bad.json"),
           f"labels file {tmp_path / 'bad.json'} must map sample names to classes (a JSON object)")
    result = _invoke("sensitivity", small["cls"], "--candidates", "0")
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.skipif(provider_available("cuda"), reason="checks the refusal where no CUDA provider runs")
def test_the_cuda_ep_where_there_is_none_is_exit_3(small):
    result = _invoke("sensitivity", small["cls"], "--ep", "cuda", "--target", "sqnr>=40")
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime (")
    assert result.stderr.count("\n") == 1 and not Path("runs").exists()


def test_library_errors(small):
    with pytest.raises(ConfigError, match=r"^candidates must be an integer >= 1 \(or every node\), got 0$"):
        SensitivityRequest(candidates=0)
    with pytest.raises(InputError, match=r"^no sample of the inputs has a label"):
        sensitivity(small["cls"], SensitivityRequest(), labels={"x": 1})


def test_accuracy_from_the_inputs_own_labels(small, tmp_path):
    """A class-folder evaluation set labels itself: accuracy is measured without --labels, on every sample."""
    from PIL import Image

    from qconsist.inputs import open_input_set

    rng = np.random.default_rng(5)
    for split, count in (("calibration", 6), ("evaluation", 6)):
        for index in range(count):
            folder = tmp_path / split / ("class_a", "class_b", "class_c")[index % 3]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    pipeline = _write_pipeline(tmp_path / "folders.toml", f'name = "folders"\n[model]\nonnx = "{small["cls_model"]}"\n'
                               '[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "calibration"\n[evaluation]\n'
                               'data = "evaluation"\n')
    run = run_pipeline(load_pipeline(pipeline), runs_dir=tmp_path / "runs", run_id="folders").path
    result = _invoke("sensitivity", run, "--target", "accuracy-drop<=0", "--json", "--candidates", "2")
    assert result.exit_code == 0, result.output
    data = SensitivityResult.from_json(json.loads(result.stdout))
    inputs = open_input_set(str(tmp_path / "evaluation"), load_pipeline(pipeline).preprocess, "x")
    session = ort.InferenceSession(str(run / "optimize" / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = inputs.labels.of(inputs.names)
    correct = sum(int(session.run(None, inputs.sample(i))[0].argmax()) == labels[i] for i in range(len(inputs)))
    assert data.labels == 6 and data.baseline.float_accuracy == correct / 6
    assert data.verification.reached and data.verification.measured.accuracy_drop <= 0
