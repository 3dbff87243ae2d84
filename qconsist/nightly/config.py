"""Nightly files (TOML): which models to run every night, how, and under which policy.

Relative paths start at the nightly file's folder. Format::

    runs_dir = "../runs"                       # run directories (default: "runs" beside the file)
    history = "../runs/history.sqlite"         # default: <runs_dir>/history.sqlite
    policy = "../policies/default.toml"        # default policy of every model (default: built-in)

    [[models]]
    name = "open_nsfw-minmax"                  # unique; the key of the model's history
    pipeline = "open_nsfw.toml"                # a pipeline file …
    [models.set.calibration]                   # … with values overridden (deep-merged into it)
    method = "MinMax"

    [[models]]
    name = "nudenet-320n"
    policy = "../policies/nudenet.toml"        # this model's policy
    gpu_config = "HEURISTIC/tf32=0"            # the GPU config the deployment pins (checked against locate)
    labels = "labels.json"                     # the evaluation samples' classes: JSON {name: class}, CSV or text
                                               # (qconsist.inputs.labels); a class-folder set labels itself
    locate = true                              # run qconsist locate where a GPU exists (default true)
    gpus = ["H100", "H200"]                    # run this entry once on each GPU type (history key name@TYPE)
    devices = 2                                # dump it on the CUDA EP on 2 distinct GPUs of one node (or "all":
                                               # every GPU of the node) and compare the dumps across the devices
    cpus = 1                                   # what one run of the entry needs: CPU cores (default 1) …
    memory_gb = 8                              # … and memory (default: not declared); the Ray executor
                                               # schedules by them (GPU types: Ray's accelerator_type)
    sensitivity = {target = "sqnr>=40"}        # when the gate fails: qconsist sensitivity of the night's run, its
                                               # verified list of nodes to keep in float in the entry (keys: target,
                                               # when = "fail" | "always", candidates, all, widen, alternatives)
    [models.pipeline]                          # … or a pipeline written inline
    [models.pipeline.model]
    source = "nudenet_320n"                    # a bundled model (models/*.toml), or onnx = "<file>"
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from qconsist.errors import ConfigError, QconsistError
from qconsist.inputs.labels import read_labels
from qconsist.nightly.package import is_package_path, resolve_package_path
from qconsist.pipeline.config import PipelineConfig, parse_pipeline
from qconsist.tomlfile import read_toml
from qconsist.locate.config import GpuConfig
from qconsist.sensitivity import SensitivityRequest, parse_targets
from qconsist.sensitivity.analysis import DEFAULT_CANDIDATES
from qconsist.store.runs import RUNS_DIR, default_history
from qconsist.store.serde import serialized

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_TOP_KEYS = {"runs_dir", "history", "policy", "models"}
_MODEL_KEYS = {"name", "pipeline", "set", "policy", "gpu_config", "labels", "locate", "gpus", "cpus", "memory_gb", "sensitivity", "devices"}
_SENSITIVITY_KEYS = {"target", "when", "candidates", "all", "widen", "alternatives"}
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,40}$")


class SensitivityWhen(str, Enum):
    FAIL = "fail"  # only when the entry's gate fails: the regression arrives with its candidate fix
    ALWAYS = "always"


@dataclass(frozen=True)
class EntrySensitivity:
    """An entry's ``sensitivity = {target = "sqnr>=40"}``: after the gate, ``qconsist sensitivity`` of the night's
    pipeline run (on the CPU), when the gate failed (``when = "fail"``, the default) or every night."""

    request: SensitivityRequest
    when: SensitivityWhen = SensitivityWhen.FAIL

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {"target": [t.text for t in r.targets], "when": self.when.value, "candidates": r.candidates,
                "widen": r.widen, "alternatives": r.alternatives}


def _sensitivity(value: Any, where: str) -> EntrySensitivity | None:
    if value is None:
        return None
    where = f"{where}: sensitivity"
    if not isinstance(value, dict):
        raise ConfigError(f'{where} must be a table such as {{target = "sqnr>=40"}}, got {value!r}')
    unknown = sorted(set(value) - _SENSITIVITY_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_SENSITIVITY_KEYS))})")
    texts = value.get("target")
    texts = [texts] if isinstance(texts, str) else texts
    if not texts or not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ConfigError(f'{where}: target must be a target or a list of them, e.g. "sqnr>=40", got {value.get("target")!r}')
    for key in ("all", "widen", "alternatives"):
        if key in value and not isinstance(value[key], bool):
            raise ConfigError(f"{where}: '{key}' must be true or false, got {value[key]!r}")
    candidates = value.get("candidates", DEFAULT_CANDIDATES)
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise ConfigError(f"{where}: 'candidates' must be an integer >= 1, got {candidates!r}")
    try:
        when = SensitivityWhen(value.get("when", "fail"))
    except ValueError:
        raise ConfigError(f"{where}: 'when' must be \"fail\" or \"always\", got {value.get('when')!r}") from None
    try:
        targets = parse_targets(texts)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    request = SensitivityRequest(targets=targets, candidates=None if value.get("all") else candidates,
                                 widen=value.get("widen", True), alternatives=value.get("alternatives", True))
    return EntrySensitivity(request, when)


@serialized
@dataclass(frozen=True)
class ModelEntry:
    name: str
    pipeline: PipelineConfig
    policy: Path | None = None
    gpu_config: str | None = None
    labels: dict[str, int] | None = None
    locate: bool = True
    gpus: tuple[str, ...] = ()  # GPU types (Ray accelerator types: "H100", "H200", "A10G"); one run on each
    cpus: float = 1.0
    memory_gb: float | None = None
    sensitivity: EntrySensitivity | None = None
    devices: int | str | None = None  # GPUs of one node to dump it on and compare across: a count, or "all"

    def keys(self) -> tuple[tuple[str, str | None], ...]:
        """(history key, GPU type) of each run of this entry: ``name`` alone, or ``name@TYPE`` per GPU type."""
        if not self.gpus:
            return ((self.name, None),)
        return tuple((f"{self.name}@{gpu}", gpu) for gpu in self.gpus)


@serialized
@dataclass(frozen=True)
class NightlyConfig:
    path: Path
    runs_dir: Path
    history: Path
    models: tuple[ModelEntry, ...]


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _string(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}")
    return value


def _labels(base: Path, text: str, where: str) -> dict[str, int]:
    """The evaluation set's labels from the file ``text`` (``qconsist.inputs.labels``: JSON, CSV or text)."""
    try:
        return dict(read_labels(base / text).by_name)
    except QconsistError as exc:
        raise type(exc)(f"{where}: {exc.template}") from None


_PATH_KEYS = {("calibration", "data"), ("evaluation", "data"), ("model", "onnx"), ("model", "prototxt"), ("model", "caffemodel")}


def _anchored(overrides: dict[str, Any], base: Path) -> dict[str, Any]:
    """Overrides with their relative paths made absolute from the nightly file's folder (not the pipeline's)."""
    anchored = copy.deepcopy(overrides)
    for table, key in _PATH_KEYS:
        section = anchored.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str) and not section[key].startswith("package:"):
            section[key] = str((base / section[key]).resolve())
    return anchored


def _entry(data: Any, index: int, base: Path, origin: Path, default_policy: Path | None) -> ModelEntry:
    where = f"{origin}: models[{index}]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table ([[models]])")
    unknown = sorted(set(data) - _MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_MODEL_KEYS))})")
    name = _string(data, "name", where)
    if not name or not _NAME_RE.match(name):
        raise ConfigError(f"{where}: 'name' must be letters, digits, '.', '_' or '-' (got {name!r})")
    where = f"{origin}: model '{name}'"
    inline = isinstance(data.get("pipeline"), dict)
    pipeline_file = None if inline else _string(data, "pipeline", where)
    if inline:
        pipeline_data, pipeline_path = dict(data["pipeline"]), origin
    elif pipeline_file is not None:
        pipeline_path = (base / pipeline_file).resolve()
        pipeline_data = read_toml(pipeline_path, "pipeline file")
    else:
        raise ConfigError(f"{where}: needs pipeline = \"<file>\" or a [models.pipeline] table")
    overrides = data.get("set", {})
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}: 'set' must be a table of pipeline values to override")
    given = copy.deepcopy(pipeline_data)
    pipeline_data = _merge(pipeline_data, _anchored(overrides, base))
    pipeline_data["name"] = name
    model = pipeline_data.get("model")
    if isinstance(model, dict) and isinstance(model.get("onnx"), str) and is_package_path(model["onnx"]):
        model["onnx"] = str(resolve_package_path(model["onnx"]))
    try:
        pipeline = parse_pipeline(pipeline_data, pipeline_path)
    except ConfigError as exc:
        if not overrides or not _parses({**given, "name": name}, pipeline_path):
            raise
        # the pipeline file alone is fine: what its 'set' table put in is to blame, and it is in the nightly file
        said = exc.message.removeprefix(f"{pipeline_path}: ")
        raise ConfigError(f"{where}: its 'set' table: {said}") from None
    policy = _string(data, "policy", where)
    gpu_config = _string(data, "gpu_config", where)
    if gpu_config is not None:

        GpuConfig.parse(gpu_config)
    labels = _string(data, "labels", where)
    locate = data.get("locate", True)
    if not isinstance(locate, bool):
        raise ConfigError(f"{where}: 'locate' must be true or false, got {locate!r}")
    return ModelEntry(
        name=name, pipeline=pipeline, policy=(base / policy).resolve() if policy else default_policy,
        gpu_config=gpu_config, labels=_labels(base, labels, where) if labels else None, locate=locate,
        gpus=_gpus(data.get("gpus", []), where), cpus=_amount(data, "cpus", where, 1.0),
        memory_gb=_amount(data, "memory_gb", where, None), sensitivity=_sensitivity(data.get("sensitivity"), where),
        devices=_devices(data.get("devices"), where),
    )


def _parses(data: dict[str, Any], path: Path) -> bool:
    try:
        parse_pipeline(data, path)
    except ConfigError:
        return False
    return True


def _gpus(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _GPU_TYPE_RE.match(v) for v in value):
        raise ConfigError(f"{where}: 'gpus' must be a list of GPU types such as [\"H100\", \"H200\"], got {value!r}")
    duplicates = sorted({v for v in value if value.count(v) > 1})
    if duplicates:
        raise ConfigError(f"{where}: GPU type '{duplicates[0]}' is listed twice in 'gpus'")
    return tuple(value)


MAX_DEVICES = 64


def _devices(value: Any, where: str) -> int | str | None:
    """``devices``: how many distinct GPUs of one node the entry is dumped on (2 or more), or "all" of them."""
    if value is None or value == "all":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_DEVICES:
        raise ConfigError(f"{where}: 'devices' must be a number of GPUs from 2 to {MAX_DEVICES} or \"all\" (every GPU "
                          f"of the node), got {value!r}")
    return value


def _amount(table: dict[str, Any], key: str, where: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 4096:
        raise ConfigError(f"{where}: '{key}' must be a number greater than 0, got {value!r}")
    return float(value)


def parse_nightly(data: Any, path: Path) -> NightlyConfig:
    path = Path(path).resolve()
    base = path.parent
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a nightly file is a table")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_TOP_KEYS))})")
    runs_dir = (base / (_string(data, "runs_dir", str(path)) or RUNS_DIR)).resolve()
    history_text = _string(data, "history", str(path))
    history = (base / history_text).resolve() if history_text else default_history(runs_dir)
    policy_text = _string(data, "policy", str(path))
    policy = (base / policy_text).resolve() if policy_text else None
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise ConfigError(f"{path}: list at least one model as [[models]] with a name and a pipeline")
    entries = tuple(_entry(m, i, base, path, policy) for i, m in enumerate(models))
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{path}: model name '{duplicates[0]}' is listed twice; names must be unique")
    return NightlyConfig(path=path, runs_dir=runs_dir, history=history, models=entries)


def load_nightly(path: Path | str) -> NightlyConfig:
    """Read and validate a nightly file (every pipeline in it included)."""
    path = Path(path)
    return parse_nightly(read_toml(path, "nightly file"), path)
