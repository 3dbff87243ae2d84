"""The release-gate policy: what a candidate must satisfy against its baseline, with explicit tolerances.

A policy is a TOML file; every key is optional and falls back to the default below. An unknown section or
key, or a value of the wrong type or out of range, is a ``ConfigError`` naming it. The resolved policy
(defaults filled in) is recorded in every verdict, so a verdict says which tolerances it applied.

Format (schema ``qconsist.policy/1``) with the defaults::

    schema = "qconsist.policy/1"

    [artifacts]
    hash = "md5"                 # md5 | sha256 | content | computation: which hash decides that a stage changed
    expect_changed = []          # stages allowed to change against the baseline, e.g. ["quantize"]

    [calibration]
    repeat_must_agree = true     # the pipeline's repeated calibration must give identical quantized models
    waive_nonfinite = []         # quantization parameters (tensor names) whose NaN/Inf/zero scale is accepted

    [inference]
    repeat_must_be_identical = true   # two inferences of the candidate on the evaluation inputs: same bytes
    allow_nonfinite_outputs = false   # NaN or Inf in the final outputs fails the gate

    [drift.float]                # candidate's quantized outputs against its own float model, each judged for what
                                 # it is (qconsist.compare.kinds; the pipeline's [evaluation] outputs declares kinds)
    max_abs_diff = "off"         # greatest absolute difference of every output, in its own units; "off" only records it
    min_top1_agreement = 0.9     # class-scores outputs: fraction of samples whose top-1 class agrees
    min_sqnr_db = 15.0           # every output and part of one: SQNR against the reference, dB

    [drift.baseline]             # candidate's quantized outputs against the baseline's quantized outputs
    max_abs_diff = 0.0
    min_top1_agreement = 1.0
    min_sqnr_db = "off"

    [labels]
    min_accuracy = 0.0           # top-1 accuracy of the quantized model where the input set has labels

    [gpu]
    require_pinned = true        # where a locate report recommends a GPU config, the candidate must pin it

    [environment]
    allow_changed = []           # numerics-relevant differences from the baseline's environment that are
                                 # accepted, e.g. ["onnxruntime"] while judging an upgrade (names: onnxruntime,
                                 # onnx, numpy, cuda, cudnn, cuda_runtime, cudnn_runtime, driver, gpu, machine,
                                 # instruction_set (the CPU kernels: qconsist.cpu) and the numerics environment
                                 # variables such as NVIDIA_TF32_OVERRIDE)

    [isa]                        # verdicts that hold on any machine of a CPU pool
    spread = []                  # QEMU CPU models (e.g. ["Haswell", "Nehalem"]) under which the gate also computes
                                 # the candidate's quantized outputs: a drift.float figure whose threshold lies
                                 # within its spread across instruction sets fails check isa.spread
    pin = false                  # compute them with session.x64quantprecision=1 (exact integer kernels on every
                                 # x86 processor) and require them bit-identical across the instruction sets

    [diff]                       # tolerances of `qconsist diff --policy` (default: exact, bit for bit)
    atol = 0.0
    rtol = 0.0
    [diff.nodes]                 # per node (label or tensor name, shell patterns; first match wins)
    # "conv_*" = { atol = 1.0 }
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from qconsist.compare.tolerance import Tolerance
from qconsist.errors import ConfigError
from qconsist.stages.base import stage_names
from qconsist.tomlfile import loads, read_text
from qconsist.environment import NUMERIC_ENV_VARS, NUMERICS

POLICY_SCHEMA = "qconsist.policy/1"


class HashKind(str, Enum):
    MD5 = "md5"
    SHA256 = "sha256"
    CONTENT = "content"
    COMPUTATION = "computation"  # the content hash less the graph name: only a change in what is computed counts


@dataclass(frozen=True)
class ArtifactPolicy:
    hash: HashKind = HashKind.MD5
    expect_changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class CalibrationPolicy:
    repeat_must_agree: bool = True
    waive_nonfinite: tuple[str, ...] = ()


@dataclass(frozen=True)
class InferencePolicy:
    repeat_must_be_identical: bool = True
    allow_nonfinite_outputs: bool = False


@dataclass(frozen=True)
class DriftLimits:
    """``None`` records the figure without judging it."""

    max_abs_diff: float | None = None  # every output, in its own units
    min_top1_agreement: float | None = None  # class-scores outputs
    min_sqnr_db: float | None = None  # every output and part of one

    def __post_init__(self) -> None:
        if self.max_abs_diff is not None and not (math.isfinite(self.max_abs_diff) and self.max_abs_diff >= 0):
            raise ConfigError(f"max_abs_diff must be a finite number >= 0, got {self.max_abs_diff}")
        if self.min_top1_agreement is not None and not 0.0 <= self.min_top1_agreement <= 1.0:
            raise ConfigError(f"min_top1_agreement must lie in [0, 1], got {self.min_top1_agreement}")
        if self.min_sqnr_db is not None and not math.isfinite(self.min_sqnr_db):
            raise ConfigError(f"min_sqnr_db must be a finite number of dB, got {self.min_sqnr_db}")


# An absolute limit has the output's own units (pixels for boxes, logits, probabilities), which no default can
# know: drift against the float model is judged by SQNR for every output (the quantize stage's floor) and by
# top-1 for class scores; drift against the baseline stays exact.
DEFAULT_MIN_SQNR_DB = 15.0


@dataclass(frozen=True)
class DriftPolicy:
    float: DriftLimits = DriftLimits(max_abs_diff=None, min_top1_agreement=0.9, min_sqnr_db=DEFAULT_MIN_SQNR_DB)
    baseline: DriftLimits = DriftLimits(max_abs_diff=0.0, min_top1_agreement=1.0, min_sqnr_db=None)


@dataclass(frozen=True)
class LabelPolicy:
    min_accuracy: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_accuracy <= 1.0:
            raise ConfigError(f"labels.min_accuracy must lie in [0, 1], got {self.min_accuracy}")


@dataclass(frozen=True)
class GpuPolicy:
    require_pinned: bool = True


@dataclass(frozen=True)
class IsaPolicy:
    spread: tuple[str, ...] = ()  # QEMU CPU models, as written (resolved when the gate runs)
    pin: bool = False


@dataclass(frozen=True)
class EnvironmentPolicy:
    allow_changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    artifacts: ArtifactPolicy = field(default_factory=ArtifactPolicy)
    calibration: CalibrationPolicy = field(default_factory=CalibrationPolicy)
    inference: InferencePolicy = field(default_factory=InferencePolicy)
    drift: DriftPolicy = field(default_factory=DriftPolicy)
    labels: LabelPolicy = field(default_factory=LabelPolicy)
    gpu: GpuPolicy = field(default_factory=GpuPolicy)
    environment: EnvironmentPolicy = field(default_factory=EnvironmentPolicy)
    isa: IsaPolicy = field(default_factory=IsaPolicy)
    diff: Tolerance = field(default_factory=Tolerance)
    source: str = "built-in defaults"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": POLICY_SCHEMA,
            "source": self.source,
            "artifacts": {"hash": self.artifacts.hash.value, "expect_changed": list(self.artifacts.expect_changed)},
            "calibration": {
                "repeat_must_agree": self.calibration.repeat_must_agree,
                "waive_nonfinite": list(self.calibration.waive_nonfinite),
            },
            "inference": {
                "repeat_must_be_identical": self.inference.repeat_must_be_identical,
                "allow_nonfinite_outputs": self.inference.allow_nonfinite_outputs,
            },
            "drift": {
                "float": _limits_json(self.drift.float),
                "baseline": _limits_json(self.drift.baseline),
            },
            "labels": {"min_accuracy": self.labels.min_accuracy},
            "gpu": {"require_pinned": self.gpu.require_pinned},
            "environment": {"allow_changed": list(self.environment.allow_changed)},
            "isa": {"spread": list(self.isa.spread), "pin": self.isa.pin},
            "diff": self.diff.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "policy") -> "Policy":
        """Build a policy from parsed TOML/JSON; every unknown key or bad value is a ``ConfigError``."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a policy must be a table of sections")
        data = dict(data)
        schema = data.pop("schema", POLICY_SCHEMA)
        if schema != POLICY_SCHEMA:
            raise ConfigError(f"{source}: schema {schema!r} is not supported (this qconsist reads {POLICY_SCHEMA!r})")
        data.pop("source", None)
        _no_unknown(data, {"artifacts", "calibration", "inference", "drift", "labels", "gpu", "environment", "isa", "diff"}, source)
        drift = _table(data, "drift", source)
        _no_unknown(drift, {"float", "baseline"}, f"{source}: [drift]")
        return cls(
            artifacts=_artifacts(_table(data, "artifacts", source), source),
            calibration=CalibrationPolicy(**_typed(_table(data, "calibration", source), CalibrationPolicy, f"{source}: [calibration]")),
            inference=InferencePolicy(**_typed(_table(data, "inference", source), InferencePolicy, f"{source}: [inference]")),
            drift=DriftPolicy(
                float=_limits(_table(drift, "float", f"{source}: [drift]"), DriftPolicy().float, f"{source}: [drift.float]"),
                baseline=_limits(_table(drift, "baseline", f"{source}: [drift]"), DriftPolicy().baseline, f"{source}: [drift.baseline]"),
            ),
            labels=_build(LabelPolicy, _typed(_table(data, "labels", source), LabelPolicy, f"{source}: [labels]"), f"{source}: [labels]"),
            gpu=GpuPolicy(**_typed(_table(data, "gpu", source), GpuPolicy, f"{source}: [gpu]")),
            environment=_environment(_table(data, "environment", source), source),
            isa=IsaPolicy(**_typed(_table(data, "isa", source), IsaPolicy, f"{source}: [isa]")),
            diff=Tolerance.from_json(_table(data, "diff", source), f"{source}: [diff]"),
            source=source,
        )


def _limits_json(limits: DriftLimits) -> dict[str, Any]:
    return {"max_abs_diff": limits.max_abs_diff, "min_top1_agreement": limits.min_top1_agreement,
            "min_sqnr_db": limits.min_sqnr_db}


def _no_unknown(data: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}")


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: '{key}' must be a table ([{key}]), got {type(value).__name__}")
    return value


_KINDS = {bool: "true or false", float: "a number", tuple: "a list of strings", HashKind: "one of md5, sha256, content, computation"}


def _coerce(value: Any, kind: Any, where: str, key: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is tuple:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif kind is HashKind:
        if isinstance(value, str) and value in {h.value for h in HashKind}:
            return HashKind(value)
    raise ConfigError(f"{where}: '{key}' must be {_KINDS[kind]}, got {value!r}")


def _kind_of(annotation: str) -> Any:
    if annotation.startswith("bool"):
        return bool
    if annotation.startswith("float"):
        return float
    if annotation.startswith("tuple"):
        return tuple
    if annotation == "HashKind":
        return HashKind
    raise AssertionError(annotation)


def _typed(data: dict, cls: type, where: str) -> dict[str, Any]:
    known = {f.name: f for f in fields(cls)}
    _no_unknown(data, set(known), where)
    return {key: _coerce(value, _kind_of(str(known[key].type)), where, key) for key, value in data.items()}


def _build(cls: type, kwargs: dict, where: str) -> Any:
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None


def _artifacts(data: dict, source: str) -> ArtifactPolicy:
    where = f"{source}: [artifacts]"
    kwargs = _typed(data, ArtifactPolicy, where)
    stages = kwargs.get("expect_changed", ())
    known = stage_names()
    bad = sorted(set(stages) - set(known))
    if bad:
        raise ConfigError(f"{where}: expect_changed names unknown stage(s) {', '.join(bad)}; stages: {', '.join(known)}")
    return ArtifactPolicy(**kwargs)


def _environment(data: dict, source: str) -> EnvironmentPolicy:

    where = f"{source}: [environment]"
    kwargs = _typed(data, EnvironmentPolicy, where)
    known = [name for name, _ in NUMERICS] + list(NUMERIC_ENV_VARS)
    bad = sorted(set(kwargs.get("allow_changed", ())) - set(known))
    if bad:
        raise ConfigError(f"{where}: allow_changed names unknown item(s) {', '.join(bad)}; known: {', '.join(known)}")
    return EnvironmentPolicy(**kwargs)


def _limits(data: dict, default: DriftLimits, where: str) -> DriftLimits:
    off = {key for key, value in data.items() if value == "off"}
    kwargs = _typed({k: v for k, v in data.items() if k not in off}, DriftLimits, where)
    kwargs.update({key: None for key in off})
    merged = {"max_abs_diff": default.max_abs_diff, "min_top1_agreement": default.min_top1_agreement,
              "min_sqnr_db": default.min_sqnr_db, **kwargs}
    return _build(DriftLimits, merged, where)


def load_policy(path: Path | str | None) -> Policy:
    """Read a policy file; ``None`` gives the built-in defaults. Raises ``ConfigError`` for any bad file."""
    if path is None:
        return Policy()
    path = Path(path)
    text = read_text(path, "policy file", ConfigError)
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "policy") -> Policy:
    return Policy.from_json(loads(text, source), source=source)
