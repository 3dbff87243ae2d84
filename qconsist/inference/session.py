"""ONNX Runtime sessions built from typed execution options, recorded as they were given.

``ExecutionOptions`` names everything that decides which kernels run: the execution provider, the graph
optimization level, intra-op threads and, on CUDA, the cuDNN algorithm search, TF32, the cuDNN workspace
and deterministic compute. ``None`` means "onnxruntime's default" and is recorded as such.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from qconsist.errors import ConfigError, InputError, UnavailableError

log = logging.getLogger(__name__)


class Provider(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


class OptimizationLevel(str, Enum):
    DISABLE = "disable"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"


class ConvAlgoSearch(str, Enum):
    EXHAUSTIVE = "EXHAUSTIVE"
    HEURISTIC = "HEURISTIC"
    DEFAULT = "DEFAULT"


_CUDA_ONLY = ("cudnn_conv_algo_search", "use_tf32", "cudnn_conv_use_max_workspace", "device_id")
_PROVIDER_NAMES = {Provider.CPU: "CPUExecutionProvider", Provider.CUDA: "CUDAExecutionProvider"}


def _enum(kind: type[Enum], value: Any, name: str) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        text = value.upper() if kind is ConvAlgoSearch else value.lower()
        try:
            return kind(text)
        except ValueError:
            pass
    known = ", ".join(m.value for m in kind)  # type: ignore[attr-defined]
    raise ConfigError(f"{name} {value!r} is not one of {known}")


@dataclass(frozen=True)
class ExecutionOptions:
    """How a model is executed. Validated on creation; CUDA-only options are refused on the CPU."""

    ep: Provider = Provider.CPU
    graph_optimization_level: OptimizationLevel = OptimizationLevel.ALL
    intra_op_threads: int | None = None  # None: onnxruntime's default (one per physical core)
    deterministic_compute: bool | None = None  # SessionOptions.use_deterministic_compute
    cudnn_conv_algo_search: ConvAlgoSearch | None = None
    use_tf32: bool | None = None
    cudnn_conv_use_max_workspace: bool | None = None
    device_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ep", _enum(Provider, self.ep, "ep"))
        object.__setattr__(
            self, "graph_optimization_level",
            _enum(OptimizationLevel, self.graph_optimization_level, "graph_optimization_level"),
        )
        if self.cudnn_conv_algo_search is not None:
            object.__setattr__(self, "cudnn_conv_algo_search", _enum(
                ConvAlgoSearch, self.cudnn_conv_algo_search, "cudnn_conv_algo_search"))
        for name in ("intra_op_threads", "device_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("deterministic_compute", "use_tf32", "cudnn_conv_use_max_workspace"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        if self.ep is Provider.CPU:
            given = [name for name in _CUDA_ONLY if getattr(self, name) is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} only apply to --ep cuda")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ExecutionOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"execution options: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            data[f.name] = value.value if isinstance(value, Enum) else value
        return data

    @property
    def provider_name(self) -> str:
        return _PROVIDER_NAMES[self.ep]

    def provider_options(self) -> dict[str, str]:
        """The options passed to the execution provider, only those given explicitly."""
        if self.ep is not Provider.CUDA:
            return {}
        options: dict[str, str] = {}
        if self.device_id is not None:
            options["device_id"] = str(self.device_id)
        if self.cudnn_conv_algo_search is not None:
            options["cudnn_conv_algo_search"] = self.cudnn_conv_algo_search.value
        if self.use_tf32 is not None:
            options["use_tf32"] = "1" if self.use_tf32 else "0"
        if self.cudnn_conv_use_max_workspace is not None:
            options["cudnn_conv_use_max_workspace"] = "1" if self.cudnn_conv_use_max_workspace else "0"
        return options


def _ort_level(level: OptimizationLevel):  # -> ort.GraphOptimizationLevel
    import onnxruntime as ort

    return {
        OptimizationLevel.DISABLE: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        OptimizationLevel.BASIC: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        OptimizationLevel.EXTENDED: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        OptimizationLevel.ALL: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]


def preload_cuda() -> None:
    """Load the CUDA and cuDNN libraries onnxruntime-gpu needs (``onnxruntime.preload_dlls``) before a CUDA
    session is created; without it a CUDA session can fall back to the CPU silently."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # noqa: BLE001 - a failed preload shows as a missing provider afterwards
            log.info("onnxruntime.preload_dlls failed: %s", exc)


def check_provider(options: ExecutionOptions) -> None:
    """Raise ``UnavailableError`` when the asked execution provider is not in this onnxruntime build."""
    import onnxruntime as ort

    if options.ep is Provider.CUDA:
        preload_cuda()
    available = ort.get_available_providers()
    if options.provider_name not in available:
        raise UnavailableError(
            f"--ep {options.ep.value} needs {options.provider_name}, which this onnxruntime does not provide "
            f"(available: {', '.join(available)}); install onnxruntime-gpu on a machine with CUDA"
        )


def create_session(
    model: str | Path | bytes,
    options: ExecutionOptions,
    *,
    level: OptimizationLevel | None = None,
    optimized_model_filepath: Path | None = None,
):  # -> ort.InferenceSession
    """An onnxruntime session of ``model`` (a path or serialized bytes) run as ``options`` say.

    ``level`` overrides the options' optimization level (the dump reloads ORT's optimized graph with
    optimizations off); ``optimized_model_filepath`` makes ORT save the graph it optimized.
    """
    import onnxruntime as ort

    check_provider(options)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = _ort_level(level or options.graph_optimization_level)
    if options.intra_op_threads is not None:
        so.intra_op_num_threads = options.intra_op_threads
    if options.deterministic_compute is not None:
        so.use_deterministic_compute = options.deterministic_compute
    if optimized_model_filepath is not None:
        so.optimized_model_filepath = str(optimized_model_filepath)
    providers: list[Any] = [(options.provider_name, options.provider_options())]
    if options.ep is Provider.CUDA:
        providers.append("CPUExecutionProvider")
    source = model if isinstance(model, bytes) else str(model)
    try:
        session = ort.InferenceSession(source, so, providers=providers)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph / RuntimeException types
        where = "the model" if isinstance(model, bytes) else str(model)
        raise InputError(f"onnxruntime cannot load {where}: {' '.join(str(exc).split())[:400]}") from None
    if options.ep is Provider.CUDA and options.provider_name not in session.get_providers():
        raise UnavailableError(f"onnxruntime fell back from {options.provider_name} to {session.get_providers()}")
    return session
