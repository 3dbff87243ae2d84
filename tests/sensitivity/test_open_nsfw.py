"""``qconsist sensitivity`` on the real open_nsfw (CPU): one calibration reproduces the run's quantized model, the
first pass's top nodes are probed, a proposal for sqnr>=45 on ``prob`` is found, re-made by the pipeline's
quantize stage and verified — and checked against an independent computation: onnxruntime's quantize_static,
calibrating itself on the same photographs with the same nodes_to_exclude, both models run by plain onnxruntime
sessions, the SQNR computed here with numpy."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from qconsist.locate.latency import LatencyOptions
from qconsist.sensitivity import SensitivityRequest, Target, sensitivity
from qconsist.sensitivity.source import open_quantized_run

RUN_MD5 = "d32c589a4245fb48acffbca376dc1985"  # the pipeline's quantized open_nsfw (README, "The two commands")


@pytest.fixture(scope="module")
def analysed(nsfw_run, tmp_path_factory):
    request = SensitivityRequest(targets=(Target.parse("sqnr>=45"),), candidates=6, latency=LatencyOptions(warmup=2, runs=10))
    return sensitivity(nsfw_run.path, request, runs_dir=tmp_path_factory.mktemp("nsfw-sensitivity"), run_id="s")


def test_one_calibration_and_the_ranking(analysed):
    result, _ = analysed
    assert result.run_md5 == result.baseline_md5 == RUN_MD5  # the recorded ranges re-make the run's model exactly
    assert result.quantizable == 107 and result.unnamed == 0  # 53 Conv, 49 Relu, Softmax, Gemm, MaxPool, AveragePool, Reshape
    assert result.baseline.worst_sqnr_db == pytest.approx(41.4, abs=0.05)
    assert len(result.probed) >= 6 and result.strategy.startswith("the first pass's top ")
    first = [n for n in result.nodes if n.first_pass_rank is not None]
    assert min(n.first_pass_rank for n in first) == 1 and all(n.first_pass is not None for n in first)
    best = result.probed[0]
    assert best.gain_db > 2.0 and best.probe.worst_sqnr_db == pytest.approx(best.gain_db + result.baseline.worst_sqnr_db)


def test_the_proposal_is_verified(analysed):
    result, path = analysed
    p, v = result.proposal, result.verification
    assert p.reached and 1 <= len(p.nodes) <= 3 and p.predicted.worst_sqnr_db >= 45
    assert v.reached and v.same_as_predicted and v.measured == p.predicted and v.stage_failures == []
    assert (path / v.model).is_file() and result.latency is not None and result.latency.provider == "cpu"
    assert result.cost.sessions > result.cost.probes > 6


class PhotoReader:
    def __init__(self, inputs) -> None:
        self.samples = iter([inputs.sample(i) for i in range(len(inputs))])

    def get_next(self):
        return next(self.samples, None)


def test_against_onnxruntime_quantize_static_and_numpy(nsfw_run, analysed, tmp_path):
    result, _ = analysed
    run = open_quantized_run(nsfw_run.path)
    calibration, evaluation = run.inputs("calibration"), run.inputs("evaluation")
    independent = tmp_path / "independent.onnx"
    quantize_static(str(run.float_model), str(independent), PhotoReader(calibration), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=result.proposal.nodes, calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    assert hashlib.md5(independent.read_bytes()).hexdigest() == result.verification.md5
    name = onnx.load(str(run.float_model), load_external_data=False).graph.input[0].name
    sessions = [ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]) for m in (run.float_model, independent)]
    outputs = [np.concatenate([s.run(None, {name: evaluation.sample(i)[name]})[0] for i in range(len(evaluation))])
               for s in sessions]
    reference, candidate = (o.astype(np.float64) for o in outputs)
    sqnr = 20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - candidate))
    assert result.verification.measured.outputs[0].sqnr_db == pytest.approx(sqnr, rel=1e-7)
    assert result.verification.measured.outputs[0].max_abs == pytest.approx(np.abs(reference - candidate).max(), rel=1e-6)
