"""Environment fingerprint: what a run's numerics may depend on, recorded in every manifest."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata

PACKAGES = (
    "qconsist", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy", "caffe2onnx", "protobuf",
    "pillow", "onnxconverter-common", "scikit-image", "scikit-learn",
)

# Environment variables that change numerics or which device and how many threads run.
NUMERIC_ENV_VARS = (
    "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "CUDNN_DETERMINISTIC", "CUDA_LAUNCH_BLOCKING",
    "ORT_DISABLE_FP16", "TF_CUDNN_DETERMINISTIC", "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[dict[str, str]]:
    """GPU name, driver and memory from nvidia-smi, where present."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            gpus.append({
                "name": parts[0], "driver": parts[1],
                "memory": parts[2] if len(parts) > 2 else "",
                "compute_capability": parts[3] if len(parts) > 3 else "",
            })
    return gpus


def _cuda_versions() -> dict[str, str | None]:
    """CUDA and cuDNN versions onnxruntime was built for (GPU builds), and torch's if it is loaded."""
    info: dict[str, str | None] = {"ort_cuda": None, "ort_cudnn": None}
    try:
        from onnxruntime.capi import build_and_package_info as build  # type: ignore

        info["ort_cuda"] = getattr(build, "cuda_version", None)
        info["ort_cudnn"] = getattr(build, "cudnn_version", None)
    except ImportError:
        pass
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            info["torch_cuda"] = torch.version.cuda
            cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            info["torch_cudnn"] = str(cudnn) if cudnn else None
        except Exception:  # noqa: BLE001 - a broken torch must not break the fingerprint
            pass
    return info


def fingerprint() -> dict:
    """The environment of this process, as JSON-ready data."""
    import onnxruntime

    return {
        "packages": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "gpus": _gpus(),
        "cuda": _cuda_versions(),
        "env": {name: os.environ.get(name) for name in NUMERIC_ENV_VARS},
    }


def describe_changes(old: dict, new: dict) -> list[str]:
    """Human-readable differences between two fingerprints (used by diff and history)."""
    changes: list[str] = []

    def walk(a: object, b: object, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        elif a != b:
            changes.append(f"{prefix}: {a!r} -> {b!r}")

    walk(old, new, "")
    return changes
