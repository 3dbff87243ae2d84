"""GPU behaviour, measured on the GPU machine (``pytest -m gpu tests/gpu``); skipped where no CUDA GPU is usable.

Run there with onnxruntime-gpu (shared/gpu/README.md). Nothing here is simulated: every assertion is about
what the CUDA EP did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qconsist.inference.session import provider_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not provider_available("cuda"), reason="needs onnxruntime-gpu and a CUDA GPU"),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tf32_exploration(nsfw_models, photo_samples):
    from qconsist.locate.config import GpuConfig
    from qconsist.locate.latency import LatencyOptions
    from qconsist.locate.explore import explore, gpu_variants

    configs = [GpuConfig.parse("HEURISTIC/tf32=1"), GpuConfig.parse("HEURISTIC/tf32=0")]
    variants, comparisons = gpu_variants(configs)
    reports, results, tagged, _, decision = explore(
        nsfw_models["qdq"], photo_samples[:2], variants, comparisons, repeats=3, latency=LatencyOptions(2, 10),
    )
    return reports, results, decision


def test_cuda_device_is_used():
    from qconsist.inference.session import require_provider

    device = require_provider("cuda")
    assert "CUDAExecutionProvider" in device.providers
    assert "NVIDIA" in device.name or "H100" in device.name or "H200" in device.name


def test_tf32_changes_origin_convs_of_the_qdq_model(tf32_exploration):
    reports, results, _ = tf32_exploration
    result = results[0]
    assert (result.reference, result.other) == ("HEURISTIC/tf32=1", "HEURISTIC/tf32=0")
    assert not result.identical
    assert result.origins and all(n.op_type.endswith("Conv") for n in result.origins)
    assert result.first_node == result.nodes[0].label
    assert result.nodes[0].origin  # the first differing node can only be an origin
    assert result.int8_changed > 0


def test_heuristic_fresh_sessions_are_bit_identical_and_observation_faithful(tf32_exploration):
    reports, _, decision = tf32_exploration
    for report in reports:
        assert report.repeats[0].sessions == 3
        assert report.stable, report.repeats[0].origins
        assert report.faithful["faithful"] is True
        assert report.settings["provider"] == "cuda"
    assert decision.config in {"HEURISTIC/tf32=1", "HEURISTIC/tf32=0"}


_OVERRIDE_SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np
from qconsist.locate.config import GpuConfig, Tf32Override
from qconsist.locate.latency import LatencyOptions
from qconsist.locate.explore import explore, gpu_variants
samples = [dict(np.load(sys.argv[2]))]
configs = [GpuConfig.parse(s) for s in ("EXHAUSTIVE/tf32=1", "EXHAUSTIVE/tf32=0", "HEURISTIC/tf32=1", "HEURISTIC/tf32=0")]
variants, comparisons = gpu_variants(configs)
_, results, _, _, _ = explore(Path(sys.argv[1]), samples, variants, comparisons, 2, LatencyOptions(0, 3))
print(json.dumps({"override": Tf32Override.from_environment().to_json(), "pairs": {
    f"{r.reference} vs {r.other}": max((n.greatest_abs for n in r.origins), default=0.0) for r in results}}))
"""


def _tf32_pairs(model: Path, sample: Path, override: str | None) -> dict:
    env = dict(os.environ)
    env.pop("NVIDIA_TF32_OVERRIDE", None)
    if override is not None:
        env["NVIDIA_TF32_OVERRIDE"] = override
    out = subprocess.run([sys.executable, "-c", _OVERRIDE_SCRIPT, str(model), str(sample)],
                         env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_nvidia_tf32_override_zero_removes_the_tf32_rounding(nsfw_models, photo_samples, tmp_path):
    """Measured: with NVIDIA_TF32_OVERRIDE=0 the greatest difference at the origin convs between use_tf32 1
    and 0 shrinks by more than 10x (no TF32 rounding left); what remains is the other algorithm's rounding."""
    import numpy as np

    np.savez(tmp_path / "sample.npz", **photo_samples[0])
    plain = _tf32_pairs(nsfw_models["qdq"], tmp_path / "sample.npz", None)
    forced = _tf32_pairs(nsfw_models["qdq"], tmp_path / "sample.npz", "0")
    print("without override:", plain["pairs"])
    print("NVIDIA_TF32_OVERRIDE=0:", forced["pairs"])
    assert plain["override"]["value"] is None and forced["override"]["disables_tf32"] is True
    pair = "EXHAUSTIVE/tf32=1 vs EXHAUSTIVE/tf32=0"
    assert plain["pairs"][pair] > 1e-4  # TF32 rounding at the origin convs (0.0016 measured)
    assert forced["pairs"][pair] < plain["pairs"][pair] / 10


def test_contention_worker_loads_the_gpu():
    from qconsist.locate.contention import GpuLoad

    with GpuLoad() as load:
        assert load.alive()
        time.sleep(3)
    assert load.summary is not None
    assert load.summary.backend in {"torch", "onnxruntime"}
    assert load.summary.iterations > 0


def test_fp16_on_cuda_runs_float16_kernels(nsfw_models, photo_samples):
    from qconsist.locate.config import GpuConfig
    from qconsist.locate.fp16 import FP16_LEVEL, analyse_fp16
    from dataclasses import replace

    execution = replace(GpuConfig.parse("HEURISTIC").execution_options(), graph_optimization_level=FP16_LEVEL)
    report = analyse_fp16(nsfw_models["float"], photo_samples[:2], execution)
    assert report.stored_as_float16
    assert report.top1_agree == 2
    assert report.execution["provider"] == "cuda"


def test_gpu_calibration_repeats_and_cpu_comparison(nsfw_models, photo_samples):
    from qconsist.locate.calibration import gpu_calibration
    from qconsist.locate.config import GpuConfig
    from qconsist.inputs.inputset import InputSet

    inputs = InputSet("photos[0:4]", "arrays", [f"{i}" for i in range(4)], lambda i: photo_samples[i])
    report = gpu_calibration(nsfw_models["float"], inputs, 2, [GpuConfig.parse("HEURISTIC")])
    assert len(report.modes) == 1 and len(report.modes[0].repeat.runs) == 2
    assert len(report.cpu_md5) == 32
    mode = report.modes[0]
    assert mode.matches_cpu == (mode.repeat.runs[0].md5 == report.cpu_md5)
    assert mode.matches_cpu or mode.cpu_differences
    json.dumps(report.to_json(), allow_nan=False)
