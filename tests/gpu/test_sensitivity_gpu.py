"""``qconsist sensitivity --ep cuda`` on the GPU machine: open_nsfw's probes run on the CUDA EP (the quantized models
are the same bytes as on the CPU: one calibration, recorded by the run), the proposal for sqnr>=45 is re-made by
the quantize stage and verified on the CUDA EP, and its latency cost is measured there, side by side with the
all-int8 and the float model. Run with ``pytest -m gpu`` there."""

from __future__ import annotations

import math

import pytest

from qconsist.inference.session import ExecutionOptions, provider_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not provider_available("cuda"), reason="needs onnxruntime-gpu and a CUDA GPU"),
]


def test_sensitivity_on_the_cuda_ep(nsfw_run, tmp_path):
    from qconsist.locate.latency import LatencyOptions
    from qconsist.sensitivity import SensitivityRequest, Target, sensitivity

    execution = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False})
    request = SensitivityRequest(targets=(Target.parse("sqnr>=45"),), candidates=8, execution=execution,
                                 latency=LatencyOptions(warmup=10, runs=50))
    result, path = sensitivity(nsfw_run.path, request, runs_dir=tmp_path, run_id="cuda")
    assert result.execution["provider"] == "cuda"
    assert result.baseline_md5 == result.run_md5  # the quantization does not depend on where it is measured
    assert result.baseline.worst_sqnr_db > 35  # int8 on the CUDA EP, against the float model on the CUDA EP
    assert result.proposal.reached and result.verification.reached and result.verification.same_as_predicted
    assert result.verification.measured == result.proposal.predicted  # the same bytes, the same EP, the same figures
    lat = result.latency
    assert lat is not None and lat.provider == "cuda" and lat.runs == 50
    assert 0 < lat.quantized_ms and 0 < lat.proposed_ms and 0 < lat.float_ms and math.isfinite(lat.ratio)
    print(f"\nCUDA EP: all int8 {lat.quantized_ms:.3f} ms, proposed ({', '.join(result.proposal.nodes)}) "
          f"{lat.proposed_ms:.3f} ms = {lat.ratio:.2f}x, float {lat.float_ms:.3f} ms; cost {result.cost.seconds['total']:.1f} s, "
          f"{result.cost.sessions} sessions")
    assert (path / "sensitivity.json").is_file()
