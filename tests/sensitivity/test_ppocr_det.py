"""A corpus model whose default quantization destroys its output (PP-OCRv4's text-detection map at −3.2 dB): no node
kept in float brings it near the target, and the tool says what does — 16-bit activations and weights, from the
same calibration, verified through the quantize stage."""

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


def test_a_destroyed_map_gets_16_bit_not_a_list_of_nodes(tmp_path):
    config = load_pipeline(REPO / "pipelines" / "ppocr_det.toml")
    config = dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, repeat=1))
    run = run_pipeline(config, runs_dir=tmp_path, run_id="det")
    request = SensitivityRequest(targets=(Target.parse("sqnr>=15"),), candidates=8, widen=False,
                                 latency=LatencyOptions(warmup=1, runs=3))
    result, _ = sensitivity(run.path, request, runs_dir=tmp_path, run_id="s")
    assert result.baseline.worst_sqnr_db == pytest.approx(-3.2, abs=0.1) and result.quantizable == 294
    assert max(n.probe.worst_sqnr_db for n in result.probed) < 1.0  # no single node brings the map back
    assert [(s.node, s.met) for s in result.alternatives][0] == ("activation_type = int16", False)
    assert result.alternatives[-1].node == "activation_type = int16, weight_type = int16" and result.alternatives[-1].met
    p, v = result.proposal, result.verification
    assert p.nodes == [] and p.quantize_changes == {"activation_type": "int16", "weight_type": "int16"}
    assert v.reached and v.same_as_predicted and v.measured.worst_sqnr_db == pytest.approx(15.6, abs=0.1)
