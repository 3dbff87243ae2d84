"""Execution providers: a small registry, each provider with its validated options and one availability check.

A provider is named as qconsist names it (``cpu``, ``cuda``) and declares the options it takes, with their
types, exactly as onnxruntime's provider options spell them. ``ExecutionOptions`` validates against this
registry, so adding a provider (TensorRT, say) is one ``ProviderSpec`` here and nothing in the callers.

Whether a provider really runs on this machine is ``qconsist.inference.session.require_provider``'s answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from qconsist.errors import ConfigError

log = logging.getLogger(__name__)


class ConvAlgoSearch(str, Enum):
    """The CUDA provider's ``cudnn_conv_algo_search``: EXHAUSTIVE times every cuDNN algorithm
    (``cudnnFindConvolutionForwardAlgorithmEx``), HEURISTIC asks cuDNN's heuristics, DEFAULT takes a fixed one."""

    EXHAUSTIVE = "EXHAUSTIVE"
    HEURISTIC = "HEURISTIC"
    DEFAULT = "DEFAULT"


@dataclass(frozen=True)
class ProviderOption:
    """One provider option: its type (bool, int or an enum), what it does, and onnxruntime's default (the one
    place qconsist knows it; ``None``: not known here, onnxruntime decides)."""

    kind: type
    help: str
    default: Any = None

    def parse(self, provider: str, name: str, value: Any) -> Any:
        """The option's value as its type; ``ConfigError`` naming provider, option and what it accepts."""
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("0", "1", "true", "false"):
                return value.lower() in ("1", "true")
            raise ConfigError(f"{provider} option {name} must be true or false, got {value!r}")
        if self.kind is int:
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
            raise ConfigError(f"{provider} option {name} must be a non-negative integer, got {value!r}")
        if issubclass(self.kind, Enum):
            if isinstance(value, self.kind):
                return value
            for member in self.kind:
                if isinstance(value, str) and value.strip().upper() == member.value.upper():
                    return member
            known = ", ".join(m.value for m in self.kind)
            raise ConfigError(f"{provider} option {name} must be one of {known}, got {value!r}")
        raise AssertionError(self.kind)

    @staticmethod
    def to_ort(value: Any) -> str:
        """onnxruntime takes provider options as strings."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, Enum):
            return str(value.value)
        return str(value)


@dataclass(frozen=True)
class ProviderSpec:
    name: str  # qconsist's name: cpu, cuda
    ort_name: str  # onnxruntime's: CPUExecutionProvider, CUDAExecutionProvider
    options: dict[str, ProviderOption] = field(default_factory=dict)
    fallback: tuple[str, ...] = ()  # providers appended after it (nodes it cannot run)
    preload: Callable[[], None] | None = None  # loads the provider's libraries before a session


def preload_cuda() -> None:
    """Load the CUDA and cuDNN libraries onnxruntime-gpu needs (``onnxruntime.preload_dlls``, 1.21 and later)
    before a CUDA session is created; without it a CUDA session can fall back to the CPU silently."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # noqa: BLE001 - a failed preload shows as an unavailable provider afterwards
            log.info("onnxruntime.preload_dlls failed: %s", exc)


PROVIDERS: dict[str, ProviderSpec] = {}


def register_provider(spec: ProviderSpec) -> ProviderSpec:
    PROVIDERS[spec.name] = spec
    return spec


CPU = register_provider(ProviderSpec("cpu", "CPUExecutionProvider"))
CUDA = register_provider(ProviderSpec(
    "cuda", "CUDAExecutionProvider",
    options={
        # onnxruntime's CUDA EP defaults (1.14 and later): device 0, exhaustive search, TF32 allowed, the largest
        # workspace, channels first
        "device_id": ProviderOption(int, "GPU device id", 0),
        "cudnn_conv_algo_search": ProviderOption(ConvAlgoSearch, "cuDNN convolution algorithm search", ConvAlgoSearch.EXHAUSTIVE),
        "use_tf32": ProviderOption(bool, "allow TF32 in cuDNN and cuBLAS (Ampere and newer)", True),
        "cudnn_conv_use_max_workspace": ProviderOption(bool, "let cuDNN use the largest workspace", True),
        "prefer_nhwc": ProviderOption(bool, "run convolutions channels last (NHWC): the dump records them in the original's order", False),
    },
    fallback=("CPUExecutionProvider",),
    preload=preload_cuda,
))


def provider_spec(name: str) -> ProviderSpec:
    if isinstance(name, Enum):
        name = str(name.value)
    spec = PROVIDERS.get(str(name).lower())
    if spec is None:
        raise ConfigError(f"unknown execution provider {name!r}; known: {', '.join(PROVIDERS)}")
    return spec
