"""A corpus model whose default quantization is poor (PaddleOCR's direction classifier: its output at 14.8 dB, below
the 15 dB floor): the proposal for sqnr>=20 keeps a few nodes in float, and the pipeline's quantize stage, re-made
with them, passes its own floor — the verified gain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qconsist.locate.latency import LatencyOptions
from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.runner import run_pipeline
from qconsist.sensitivity import SensitivityRequest, Target, sensitivity

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_a_poor_quantization_gets_a_verified_fix(tmp_path):
    config = load_pipeline(REPO / "pipelines" / "ppocr_cls.toml")
    config = dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, repeat=1))
    run = run_pipeline(config, runs_dir=tmp_path, run_id="cls")
    assert run.failures  # below the floor: the pipeline says so
    request = SensitivityRequest(targets=(Target.parse("sqnr>=20"),), latency=LatencyOptions(warmup=1, runs=5))
    result, path = sensitivity(run.path, request, runs_dir=tmp_path, run_id="s")
    assert result.baseline_md5 == result.run_md5 and result.baseline.worst_sqnr_db == pytest.approx(14.8, abs=0.1)
    assert result.quantizable == 152 and result.unnamed == 2
    p, v = result.proposal, result.verification
    assert p.reached and 1 <= len(p.nodes) <= 4 and p.quantize_changes == {}
    assert v.reached and v.same_as_predicted and v.measured == p.predicted
    assert v.measured.worst_sqnr_db >= 20 and v.measured.worst_sqnr_db - result.baseline.worst_sqnr_db > 5
    assert v.stage_failures == [] and v.stage_check["passed"] is True  # the stage's own floor, on its evaluation inputs
    assert result.latency is not None and result.latency.ratio > 0
