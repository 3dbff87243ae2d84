"""GPU calibration on this machine: the provider hook and the refusals (the GPU run is in test_on_gpu.py)."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError, UnavailableError
from qconsist.locate.calibration import gpu_calibration
from qconsist.locate.config import GpuConfig
from qconsist.inference.session import provider_available
from qconsist.stages.quantize import CalibrationOptions


def test_calibration_session_gets_the_configs_cuda_options():
    config = GpuConfig.parse("HEURISTIC/tf32=0/workspace=1")
    options = CalibrationOptions(execution=config.execution_options())
    assert CalibrationOptions().ort_providers() == ["CPUExecutionProvider"]
    if provider_available("cuda"):
        assert options.ort_providers() == [("CUDAExecutionProvider", {
            "cudnn_conv_algo_search": "HEURISTIC", "cudnn_conv_use_max_workspace": "1", "use_tf32": "0"}),
            "CPUExecutionProvider"]
    else:
        with pytest.raises(UnavailableError, match=r"execution provider cuda \(CUDAExecutionProvider\) is not in this onnxruntime"):
            options.ort_providers()


def test_gpu_calibration_refusals(nsfw_models, photo_samples):
    from qconsist.inputs.inputset import InputSet

    inputs = InputSet("photos", "arrays", ["0"], lambda i: photo_samples[i])
    with pytest.raises(ConfigError, match="calibration_repeats must be >= 2 to compare repeats, got 1"):
        gpu_calibration(nsfw_models["float"], inputs, 1, [GpuConfig()])
    with pytest.raises(ConfigError, match="GPU calibration needs at least one configuration"):
        gpu_calibration(nsfw_models["float"], inputs, 2, [])
    if not provider_available("cuda"):
        with pytest.raises(UnavailableError, match="^execution provider cuda "):
            gpu_calibration(nsfw_models["float"], inputs, 2, [GpuConfig()])
