"""GPU calibration on this machine: the provider hook and the refusals (the GPU run is in test_on_gpu.py)."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError, UnavailableError
from qconsist.gpu.calibration import cuda_calibration_provider, gpu_calibration
from qconsist.gpu.config import GpuConfig
from qconsist.gpu.device import cuda_available
from qconsist.stages import quantize as quantize_stage


def test_provider_hook_is_scoped_and_keeps_the_cpu():
    original = quantize_stage.provider_name
    with cuda_calibration_provider(GpuConfig.parse("HEURISTIC/tf32=0")):
        assert quantize_stage.provider_name is not original
        assert quantize_stage.provider_name("cpu") == "CPUExecutionProvider"
        if cuda_available():
            assert quantize_stage.provider_name("cuda") == ("CUDAExecutionProvider", {
                "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0", "cudnn_conv_use_max_workspace": "1"})
        else:
            with pytest.raises(UnavailableError, match="CUDAExecutionProvider is not available in this onnxruntime"):
                quantize_stage.provider_name("cuda")
    assert quantize_stage.provider_name is original


def test_gpu_calibration_refusals(nsfw_models, photo_samples):
    from qconsist.inputs.inputset import InputSet

    inputs = InputSet("photos", "arrays", ["0"], lambda i: photo_samples[i])
    with pytest.raises(ConfigError, match="--calibration-repeats must be >= 2 to compare repeats, got 1"):
        gpu_calibration(nsfw_models["float"], inputs, 1, [GpuConfig()])
    with pytest.raises(ConfigError, match="GPU calibration needs at least one configuration"):
        gpu_calibration(nsfw_models["float"], inputs, 2, [])
    if not cuda_available():
        with pytest.raises(UnavailableError, match="^no CUDA GPU: "):
            gpu_calibration(nsfw_models["float"], inputs, 2, [GpuConfig()])
