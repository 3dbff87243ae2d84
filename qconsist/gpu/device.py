"""Is there a CUDA GPU that ONNX Runtime can use? Answered once, by really running on it.

``onnxruntime.get_available_providers()`` lists the CUDA EP whenever onnxruntime-gpu is installed, even
where no GPU or no CUDA library is present; ONNX Runtime then quietly falls back to the CPU. So the check
builds a one-node model, runs it on the CUDA EP and requires the session to report the CUDA EP first.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from qconsist.errors import UnavailableError

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"


@dataclass(frozen=True)
class CudaDevice:
    """What the check found: the providers ONNX Runtime offers and the GPU's name where known."""

    providers: tuple[str, ...]
    name: str

    def to_json(self) -> dict:
        return {"providers": list(self.providers), "name": self.name}


def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries (onnxruntime-gpu >= 1.21 ships ``preload_dlls``)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # noqa: BLE001 - preload is best effort; the session check decides
            log.info("onnxruntime.preload_dlls failed: %s", exc)


def _probe_model() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _gpu_name() -> str:
    from qconsist.environment import fingerprint

    gpus = fingerprint().get("gpus") or []
    return gpus[0]["name"] if gpus else "unknown GPU"


@functools.lru_cache(maxsize=1)
def require_cuda() -> CudaDevice:
    """The CUDA device, or ``UnavailableError`` with one line saying what is missing."""
    providers = tuple(ort.get_available_providers())
    if CUDA_EP not in providers:
        raise UnavailableError(
            "no CUDA GPU: this onnxruntime has no CUDAExecutionProvider "
            f"({', '.join(providers)}); run qconsist locate with onnxruntime-gpu on a machine with an NVIDIA GPU"
        )
    preload_cuda_libraries()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        session = ort.InferenceSession(_probe_model(), so, providers=[CUDA_EP])
        session.run(None, {"x": np.arange(4, dtype=np.float32)})
    except Exception as exc:  # noqa: BLE001 - any failure here means the GPU cannot be used
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UnavailableError(f"no usable CUDA GPU: the CUDA execution provider failed to start ({first})") from None
    if session.get_providers()[0] != CUDA_EP:
        raise UnavailableError(
            "no usable CUDA GPU: onnxruntime fell back to the CPU (CUDA or cuDNN libraries not found)"
        )
    return CudaDevice(providers=providers, name=_gpu_name())


def cuda_available() -> bool:
    try:
        require_cuda()
    except UnavailableError:
        return False
    return True


__all__ = ["CUDA_EP", "CudaDevice", "cuda_available", "preload_cuda_libraries", "require_cuda"]
