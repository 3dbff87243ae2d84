"""The configuration matrix that ``qconsist locate`` explores on the CUDA execution provider.

A ``GpuConfig`` is one way to run the CUDA EP: overrides of four CUDA settings of an ``ExecutionOptions`` —
the cuDNN convolution algorithm search, TF32, the maximum cuDNN workspace and ORT's deterministic compute
(``apply``). There is one model of those settings, ``ExecutionOptions``: ``None`` means "ONNX Runtime's default"
and is resolved where the defaults are declared (``ExecutionOptions.setting``, the provider registry).
A config is written and parsed as a spec such as ``EXHAUSTIVE/tf32=0`` or ``HEURISTIC/tf32=1/workspace=0/deterministic=1``.

The default matrix is the three search modes times TF32 on and off, ORT's defaults (EXHAUSTIVE, TF32 on)
first: that first config is the reference the others are compared with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from qconsist.errors import ConfigError
from qconsist.inference.session import ConvAlgoSearch, ExecutionOptions

TF32_OVERRIDE_VAR = "NVIDIA_TF32_OVERRIDE"
CUDA = ExecutionOptions("cuda")  # the CUDA EP with onnxruntime's defaults: what a config overrides by default
# the ExecutionOptions name of each GpuConfig field
_SETTINGS = {"algo_search": "cudnn_conv_algo_search", "use_tf32": "use_tf32",
             "max_workspace": "cudnn_conv_use_max_workspace", "deterministic": "deterministic_compute"}


AlgoSearch = ConvAlgoSearch  # the CUDA EP's cudnn_conv_algo_search modes, as the run options name them


def timing_based(search: ConvAlgoSearch) -> bool:
    """Whether the pick depends on timings (EXHAUSTIVE: cudnnFind…), and so may move under load.

    HEURISTIC asks cuDNN's heuristics and DEFAULT takes a fixed algorithm: no timing involved."""
    return search is ConvAlgoSearch.EXHAUSTIVE


def parse_search(text: str) -> ConvAlgoSearch:
    try:
        return ConvAlgoSearch(text.strip().upper())
    except ValueError:
        raise ConfigError(
            f"unknown cudnn_conv_algo_search {text!r}; use one of {', '.join(m.value for m in ConvAlgoSearch)}"
        ) from None


_FLAG_KEYS = {"tf32": "use_tf32", "workspace": "max_workspace", "deterministic": "deterministic"}


def _parse_flag(key: str, value: str, spec: str) -> bool:
    if value not in ("0", "1"):
        raise ConfigError(f"config {spec!r}: {key} must be 0 or 1, not {value!r}")
    return value == "1"


@dataclass(frozen=True)
class GpuConfig:
    """One CUDA EP configuration: overrides on an ``ExecutionOptions``; ``None`` fields leave its setting
    (ONNX Runtime's default when it has none)."""

    algo_search: AlgoSearch = CUDA.setting("cudnn_conv_algo_search")
    use_tf32: bool | None = None
    max_workspace: bool | None = None
    deterministic: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.algo_search, ConvAlgoSearch):
            object.__setattr__(self, "algo_search", parse_search(str(self.algo_search)))
        for name in ("use_tf32", "max_workspace", "deterministic"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"GpuConfig.{name} must be true, false or unset, not {value!r}")

    def overrides(self) -> dict[str, object]:
        """The settings this config sets, by their ``ExecutionOptions`` names (``with_options`` keys)."""
        return {_SETTINGS[name]: getattr(self, name) for name in _SETTINGS if getattr(self, name) is not None}

    def apply(self, options: ExecutionOptions = CUDA) -> ExecutionOptions:
        """``options`` with this config's settings (they must be the CUDA EP's)."""
        if options.provider != "cuda":
            raise ConfigError(f"a GPU config applies to the cuda execution provider, not {options.provider}")
        return options.with_options(**self.overrides())

    def _setting(self, name: str) -> bool:
        return bool(self.apply().setting(_SETTINGS[name]))

    @property
    def tf32(self) -> bool:
        return self._setting("use_tf32")

    @property
    def workspace(self) -> bool:
        return self._setting("max_workspace")

    @property
    def deterministic_compute(self) -> bool:
        return self._setting("deterministic")

    def resolved(self) -> "GpuConfig":
        """The same config with every default spelt out (ONNX Runtime's, from ``ExecutionOptions.setting``)."""
        return GpuConfig(self.algo_search, self.tf32, self.workspace, self.deterministic_compute)

    @property
    def label(self) -> str:
        """The canonical spec: search mode and TF32 always, workspace and determinism when not default."""
        parts = [self.algo_search.value, f"tf32={int(self.tf32)}"]
        if self.workspace != CUDA.setting("cudnn_conv_use_max_workspace"):
            parts.append(f"workspace={int(self.workspace)}")
        if self.deterministic_compute != CUDA.setting("deterministic_compute"):
            parts.append(f"deterministic={int(self.deterministic_compute)}")
        return "/".join(parts)

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, spec: str) -> "GpuConfig":
        """``SEARCH[/tf32=0|1][/workspace=0|1][/deterministic=0|1]``, case-insensitive search mode."""
        text = spec.strip()
        if not text:
            raise ConfigError("empty config spec; write e.g. EXHAUSTIVE/tf32=0")
        head, *rest = text.split("/")
        values: dict[str, bool] = {}
        for item in rest:
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in _FLAG_KEYS:
                raise ConfigError(
                    f"config {spec!r}: unknown setting {item!r}; use tf32=0|1, workspace=0|1, deterministic=0|1"
                )
            if _FLAG_KEYS[key] in values:
                raise ConfigError(f"config {spec!r}: {key} is given twice")
            values[_FLAG_KEYS[key]] = _parse_flag(key, value.strip(), spec)
        return cls(parse_search(head), **values).resolved()

    def with_tf32(self, value: bool) -> "GpuConfig":
        return replace(self.resolved(), use_tf32=value)

    def execution_options(self, options: ExecutionOptions = CUDA) -> ExecutionOptions:
        """``options`` (default: the CUDA EP's defaults) under this config, its four settings explicit."""
        return self.resolved().apply(options)

    def to_json(self) -> dict:
        cfg = self.resolved()
        return {
            "label": cfg.label, "cudnn_conv_algo_search": cfg.algo_search.value, "use_tf32": cfg.tf32,
            "cudnn_conv_use_max_workspace": cfg.workspace, "deterministic_compute": cfg.deterministic_compute,
        }

    @classmethod
    def from_json(cls, data: dict) -> "GpuConfig":
        try:
            return cls(
                parse_search(data["cudnn_conv_algo_search"]), bool(data["use_tf32"]),
                bool(data["cudnn_conv_use_max_workspace"]), bool(data["deterministic_compute"]),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"invalid GPU config record {data!r}: {exc}") from None


def default_matrix(
    searches: Sequence[AlgoSearch] = tuple(AlgoSearch),
    tf32: Sequence[bool] = (True, False),
    workspace_variants: bool = False,
    deterministic_variants: bool = False,
) -> list[GpuConfig]:
    """Search modes × TF32, ORT's default first; optionally each also without the max workspace and with
    deterministic compute."""
    if not searches or not tf32:
        raise ConfigError("the configuration matrix needs at least one search mode and one TF32 setting")
    configs = [GpuConfig(s, t).resolved() for s in searches for t in tf32]
    extra: list[GpuConfig] = []
    if workspace_variants:
        extra += [replace(c, max_workspace=not CUDA.setting("cudnn_conv_use_max_workspace")) for c in configs]
    if deterministic_variants:
        extra += [replace(c, deterministic=True) for c in configs]
    return unique_configs(configs + extra)


def unique_configs(configs: Iterable[GpuConfig]) -> list[GpuConfig]:
    """Resolved configs in order, duplicates removed; an empty matrix is an error."""
    seen: dict[str, GpuConfig] = {}
    for cfg in configs:
        cfg = cfg.resolved()
        seen.setdefault(cfg.label, cfg)
    if not seen:
        raise ConfigError("the configuration matrix is empty")
    return list(seen.values())


def parse_matrix(specs: Sequence[str]) -> list[GpuConfig]:
    """Configs from specs (each may hold several separated by commas)."""
    items = [part for spec in specs for part in spec.split(",") if part.strip()]
    return unique_configs(GpuConfig.parse(item) for item in items)


def tf32_pairs(configs: Sequence[GpuConfig]) -> list[tuple[GpuConfig, GpuConfig]]:
    """(TF32 on, TF32 off) pairs of configs that differ only in TF32."""
    by_label = {c.label: c for c in configs}
    pairs = []
    for cfg in configs:
        if cfg.tf32:
            off = cfg.with_tf32(False)
            if off.label in by_label:
                pairs.append((cfg, by_label[off.label]))
    return pairs


@dataclass(frozen=True)
class Tf32Override:
    """``NVIDIA_TF32_OVERRIDE`` as this process sees it, and what it does to ``use_tf32``."""

    value: str | None

    @classmethod
    def from_environment(cls) -> "Tf32Override":
        return cls(os.environ.get(TF32_OVERRIDE_VAR))

    @property
    def disables_tf32(self) -> bool:
        return self.value is not None and self.value.strip() == "0"

    def explanation(self) -> str:
        if self.value is None:
            return f"{TF32_OVERRIDE_VAR} is unset: use_tf32 decides whether cuDNN/cuBLAS may use TF32."
        if self.disables_tf32:
            return (
                f"{TF32_OVERRIDE_VAR}=0 overrides use_tf32: NVIDIA's libraries are told never to use TF32 in this "
                "process; use_tf32 still sets the math mode ONNX Runtime asks cuDNN for, which can change the "
                "algorithm picked, so the tf32=1 / tf32=0 pairs below show what remains."
            )
        return (
            f"{TF32_OVERRIDE_VAR}={self.value!r} has no effect (only 0 overrides use_tf32, by disabling TF32)."
        )

    def to_json(self) -> dict:
        return {"variable": TF32_OVERRIDE_VAR, "value": self.value, "disables_tf32": self.disables_tf32,
                "explanation": self.explanation()}
