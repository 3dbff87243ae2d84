"""Environment fingerprint: what a run's numerics may depend on, recorded in every manifest.

``fingerprint()`` is what a manifest records; ``compare_environments`` tells two fingerprints apart, the
changes that are known to change results first (onnxruntime, onnx, numpy, CUDA, cuDNN, driver, GPU, the
numerics environment variables); ``check_environment`` is ``qconsist env``: the fingerprint with warnings
where this environment is known to give other results than expected.
"""

from __future__ import annotations

import tomllib
import ctypes
import os
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from qconsist.cpu import InstructionSet, instruction_set

PACKAGES = (
    "qconsist", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy", "caffe2onnx", "protobuf",
    "pillow", "onnxconverter-common", "scikit-image", "scikit-learn",
)

# Environment variables that change numerics or which device, which kernels and how many threads run
# (OPENBLAS_CORETYPE and MKL_CBWR choose the BLAS kernels, which round differently).
NUMERIC_ENV_VARS = (
    "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "CUDNN_DETERMINISTIC", "CUDA_LAUNCH_BLOCKING",
    "ORT_DISABLE_FP16", "TF_CUDNN_DETERMINISTIC", "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
    "OPENBLAS_CORETYPE", "MKL_CBWR",
)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    isa = instruction_set()
    if isa.emulated:  # /proc/cpuinfo shows the host under QEMU: the model is the emulated one
        return f"{isa.model or isa.emulated} (emulated by QEMU {isa.qemu or ''}, model {isa.emulated})".replace("  ", " ")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_GPUS: list[list[dict[str, str]]] = []  # nvidia-smi's answer, asked once per process
_GPUS_LOCK = threading.Lock()


def _gpus() -> list[dict[str, str]]:
    """GPU name, driver and memory from nvidia-smi, where present (asked once per process)."""
    with _GPUS_LOCK:
        if not _GPUS:
            _GPUS.append(_query_gpus())
        return [dict(gpu) for gpu in _GPUS[0]]


def prefetch_gpus() -> None:
    """Ask nvidia-smi now, in a thread of its own: ``fingerprint``, at the end of a run, then finds the answer
    instead of waiting for the tool (its start is off the run's critical path)."""
    threading.Thread(target=_gpus, name="qconsist-gpus", daemon=True).start()


def _query_gpus() -> list[dict[str, str]]:
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
    info.update(_cuda_runtime_versions())
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            info["torch_cuda"] = torch.version.cuda
            cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            info["torch_cudnn"] = str(cudnn) if cudnn else None
        except Exception:  # noqa: BLE001 - a broken torch must not break the fingerprint
            pass
    return info


def _cuda_runtime_versions() -> dict[str, str | None]:
    """The cuDNN and CUDA runtime this process has loaded (after a CUDA session or ``preload_dlls``), asked
    of the libraries themselves: the build's versions above are what onnxruntime was compiled against."""
    found: dict[str, str | None] = {"cudnn_runtime": None, "cudart_runtime": None}
    if not sys.platform.startswith("linux"):
        return found
    loaded = _loaded_libraries()
    for key, stem, symbol in (("cudnn_runtime", "libcudnn.so", "cudnnGetVersion"),
                              ("cudart_runtime", "libcudart.so", "cudaRuntimeGetVersion")):
        path = next((lib for lib in loaded if Path(lib).name.startswith(stem)), None)
        if path is None:
            continue
        try:
            library = ctypes.CDLL(path)
            if symbol == "cudnnGetVersion":
                library.cudnnGetVersion.restype = ctypes.c_size_t
                version = int(library.cudnnGetVersion())
                found[key] = f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
            else:
                value = ctypes.c_int(0)
                if library.cudaRuntimeGetVersion(ctypes.byref(value)) == 0:
                    found[key] = f"{value.value // 1000}.{value.value % 1000 // 10}"
        except (OSError, AttributeError):
            continue
    return found


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as handle:
            return sorted({line.split()[-1] for line in handle if ".so" in line and "/" in line})
    except OSError:
        return []


def fingerprint() -> dict:
    """The environment of this process, as JSON-ready data."""
    import onnxruntime

    return {
        "packages": {name: _version(name) for name in PACKAGES},
        "onnxruntime_module": onnxruntime.__version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_isa": instruction_set().to_json(),
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "gpus": _gpus(),
        "cuda": _cuda_versions(),
        "env": {name: os.environ.get(name) for name in NUMERIC_ENV_VARS},
    }


def describe_changes(old: dict, new: dict) -> list[str]:
    """Human-readable differences between two fingerprints (used by diff and history)."""
    changes: list[str] = []
    kernels = instruction_set_change(old, new)
    if kernels:
        changes.append(kernels)

    def walk(a: object, b: object, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        elif a != b:
            changes.append(f"{prefix}: {a!r} -> {b!r}")

    walk(old, new, "")
    return changes


# What changes results, in the order a user should read it: a change here is "a common, real cause of the
# same model giving other results". (name used in messages and policies, fingerprint key)
NUMERICS = (
    ("onnxruntime", "onnxruntime"), ("onnx", "packages.onnx"), ("numpy", "packages.numpy"),
    ("cuda", "cuda.ort_cuda"), ("cudnn", "cuda.ort_cudnn"),
    ("cuda_runtime", "cuda.cudart_runtime"), ("cudnn_runtime", "cuda.cudnn_runtime"),
    ("driver", "gpus.driver"), ("gpu", "gpus.name"), ("machine", "machine"),
    ("instruction_set", "cpu_isa"),
    # the image decoder and resampler: another Pillow resizes some photos differently (ppocr_cls's BILINEAR
    # 102x102 -> 192x48 by one level in 3,684 of 27,648 values between 12.3 and 13.0: 15.04 vs 14.82 dB)
    ("pillow", "packages.pillow"),
)
RECORDED_LATER = {"instruction_set", "pillow"}  # absent from some older runs' fingerprints: unknown, not a change


def recorded_isa(fp: dict | None) -> InstructionSet | None:
    """The instruction set a fingerprint recorded (``None`` for runs recorded before it was)."""
    data = (fp or {}).get("cpu_isa")
    return InstructionSet.from_json(data) if isinstance(data, dict) else None


def instruction_set_change(a: dict | None, b: dict | None) -> str | None:
    """"ran different CPU kernels: AVX2 without VNNI vs AVX-512 VNNI" where the two fingerprints recorded
    instruction sets that make onnxruntime's CPU provider choose other kernels; ``None`` where they chose the
    same or one of them did not record it (unknown)."""
    isa_a, isa_b = recorded_isa(a), recorded_isa(b)
    if isa_a is None or isa_b is None:
        return None
    if (isa_a.kernels, isa_a.float_kernels) == (isa_b.kernels, isa_b.float_kernels):
        return None
    where = lambda isa: f"emulated {isa.emulated}" if isa.emulated else f"native {isa.model or isa.vendor}".rstrip()  # noqa: E731
    return (f"ran different CPU kernels: {isa_a.kernels} vs {isa_b.kernels} (float {isa_a.float_kernels} vs "
            f"{isa_b.float_kernels}; {where(isa_a)} vs {where(isa_b)})")


def _effective_onnxruntime(fp: dict) -> str | None:
    packages = fp.get("packages") or {}
    gpu, cpu = packages.get("onnxruntime-gpu"), packages.get("onnxruntime")
    module = fp.get("onnxruntime_module")
    version = module or gpu or cpu
    if version is None:
        return None
    build = "onnxruntime-gpu" if gpu and (gpu == version or not cpu) else "onnxruntime"
    return f"{version} ({build})"


def _lookup(fp: dict, key: str) -> Any:
    if key == "onnxruntime":
        return _effective_onnxruntime(fp)
    if key == "cpu_isa":
        isa = recorded_isa(fp)
        return None if isa is None else f"{isa.kernels}, float {isa.float_kernels}"
    if key.startswith("gpus."):
        field_name = key.split(".", 1)[1]
        values = sorted({str(g.get(field_name)) for g in fp.get("gpus") or [] if isinstance(g, dict)})
        return ", ".join(values) or None
    value: Any = fp
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


@dataclass(frozen=True)
class EnvironmentChange:
    """One numerics-relevant difference: ``name`` (``onnxruntime``, ``cudnn``, an environment variable…)."""

    name: str
    old: Any  # the values as the fingerprints hold them (a version string, a number, None when absent)
    new: Any

    def __str__(self) -> str:
        if self.name == "instruction_set":
            return f"instruction set (CPU kernels): {self.old} -> {self.new}"
        return f"{self.name}: {self.old if self.old is not None else 'absent'} -> {self.new if self.new is not None else 'absent'}"


@dataclass(frozen=True)
class EnvironmentDiff:
    """How two runs' environments differ: ``numerics`` (known to change results), then everything else."""

    numerics: tuple[EnvironmentChange, ...] = ()
    other: tuple[str, ...] = ()

    @property
    def same_numerics(self) -> bool:
        return not self.numerics

    @property
    def kernels(self) -> EnvironmentChange | None:
        """The instruction-set change, when the runs' CPUs made onnxruntime choose other integer kernels."""
        return next((c for c in self.numerics if c.name == "instruction_set"), None)


def compare_environments(a: dict, b: dict) -> EnvironmentDiff:
    """The numerics-relevant differences of two fingerprints (a -> b), then the rest as text lines."""
    a, b = a or {}, b or {}
    numerics = []
    for name, key in NUMERICS:
        old, new = _lookup(a, key), _lookup(b, key)
        if name in RECORDED_LATER and (old is None or new is None):
            continue  # a run recorded before it was (or without Pillow installed): unknown, not a change
        if old != new:
            numerics.append(EnvironmentChange(name, old, new))
    for name in NUMERIC_ENV_VARS:
        old, new = (a.get("env") or {}).get(name), (b.get("env") or {}).get(name)
        if old != new:
            numerics.append(EnvironmentChange(name, old, new))
    covered = ("packages.onnxruntime", "packages.onnx", "onnxruntime_module", "packages.numpy", "packages.pillow", "machine", "env.",
               "cuda.", "gpus", "ran different CPU kernels", "cpu_isa.kernels", "cpu_isa.float_kernels")
    other = [line for line in describe_changes(a, b) if not line.split(":", 1)[0].startswith(covered)]
    return EnvironmentDiff(tuple(numerics), tuple(other))


@dataclass(frozen=True)
class EnvironmentReport:
    """``qconsist env``: this process's fingerprint, what onnxruntime can load, and warnings."""

    fingerprint: dict
    onnxruntime: str | None  # "1.31.1 (onnxruntime-gpu)"
    newest_opset: int | None
    newest_ir: int | None
    locked: dict[str, str] = field(default_factory=dict)  # package -> version in uv.lock, when found
    warnings: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.warnings

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "qconsist.env/1", "passed": self.passed, "onnxruntime": self.onnxruntime,
            "newest_opset": self.newest_opset, "newest_ir": self.newest_ir, "locked": self.locked,
            "warnings": list(self.warnings), "fingerprint": self.fingerprint,
        }


def locked_versions(lock: Path | None = None) -> dict[str, str]:
    """Versions of the numerics-relevant packages in the project's uv.lock (source checkouts only)."""
    lock = lock or Path(__file__).resolve().parent.parent / "uv.lock"
    try:
        data = tomllib.loads(lock.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    from packaging.markers import Marker

    wanted = {"onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "protobuf", "caffe2onnx"}
    found: dict[str, str] = {}
    for package in data.get("package", []):
        if package.get("name") not in wanted or "version" not in package:
            continue
        markers = package.get("resolution-markers") or []  # a universal lock forks by Python version
        if markers and not any(Marker(m).evaluate() for m in markers):
            continue
        found[package["name"]] = package["version"]
    return found


def check_environment(limits: tuple[int | None, int | None] = (None, None), lock: Path | None = None) -> EnvironmentReport:
    """This environment, and what in it is known to change results or to differ from the lock. ``limits``:
    the newest opset and IR version onnxruntime loads (``qconsist.inference.session.onnxruntime_limits``)."""
    fp = fingerprint()
    packages = fp["packages"]
    warnings: list[str] = []
    cpu, gpu = packages.get("onnxruntime"), packages.get("onnxruntime-gpu")
    if cpu and gpu:
        warnings.append(
            f"onnxruntime {cpu} and onnxruntime-gpu {gpu} are both installed: they share one module, so whichever "
            f"was installed last is imported ({fp['onnxruntime_module']}); uninstall one (qconsist[cpu] or qconsist[gpu])"
        )
    locked = locked_versions(lock)
    for name in ("onnxruntime", "onnxruntime-gpu", "onnx", "numpy"):
        if packages.get(name) and locked.get(name) and packages[name] != locked[name]:
            warnings.append(f"{name} {packages[name]} is installed but uv.lock says {locked[name]}: "
                            f"this is not the locked environment (make setup installs it)")
    tf32 = fp["env"].get("NVIDIA_TF32_OVERRIDE")
    if tf32 is not None:
        warnings.append(f"NVIDIA_TF32_OVERRIDE={tf32} is set: it overrides use_tf32 for every CUDA session "
                        f"(0 disables TF32 everywhere), so a run's recorded cuDNN options are not what ran")
    providers = fp["onnxruntime_providers"]
    if fp["gpus"] and "CUDAExecutionProvider" not in providers:
        warnings.append(f"a GPU is present ({fp['gpus'][0]['name']}) but onnxruntime has no CUDA execution "
                        f"provider: install onnxruntime-gpu (qconsist[gpu]) to run or locate on it")
    if "CUDAExecutionProvider" in providers and not fp["gpus"]:
        warnings.append("onnxruntime has the CUDA execution provider but nvidia-smi finds no GPU")
    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG"):
        if fp["env"].get(name) is not None:
            warnings.append(f"{name}={fp['env'][name]} is set: recorded, as it changes how CUDA work runs")
    return EnvironmentReport(fp, _effective_onnxruntime(fp), limits[0], limits[1], locked, tuple(warnings))
