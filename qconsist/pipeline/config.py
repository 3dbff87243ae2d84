"""Pipeline files (TOML) → frozen, validated dataclasses. Unknown keys are errors naming their path.

Relative paths in the file are relative to the file's folder. See docs/pipeline.md ("Pipeline file") for every
key and its default; ``PipelineConfig.to_json`` is what the manifest records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from qconsist.compare.kinds import OutputKind, parse_kinds
from qconsist.errors import ConfigError
from qconsist.inference.provider import PROVIDERS, provider_spec
from qconsist.inference.session import ExecutionOptions
from qconsist.inputs.package import PREFIX as PACKAGE_PREFIX
from qconsist.inputs.package import resolve_package_path
from qconsist.inputs.preprocess import Preprocess
from qconsist.stages.base import Stage
from qconsist.stages.base import stages as registered_stages
from qconsist.stages.convert import ConvertOptions
from qconsist.stages.optimize import OptimizeOptions
from qconsist.store.runs import RUNS_DIR
from qconsist.store.rundir import MAX_LABEL
from qconsist.limits import shorten
from qconsist.stages.quantize import CalibrationMethodChoice, CalibrationOptions, DistributionScenario, QuantizeOptions
from qconsist.tomlfile import Table, guard, read_toml
from qconsist.store.serde import serialized

MAX_REPEAT = 100


class ModelKind(str, Enum):
    BUNDLED = "bundled"  # source = "<name>": models/<name>.toml, fetched
    CAFFE = "caffe"  # prototxt + caffemodel
    ONNX = "onnx"  # onnx: skips convert


@dataclass(frozen=True)
class ModelConfig:
    kind: ModelKind
    source: str | None = None
    prototxt: Path | None = None
    caffemodel: Path | None = None
    onnx: Path | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind.value}
        for key in ("source", "prototxt", "caffemodel", "onnx"):
            value = getattr(self, key)
            if value is not None:
                data[key] = str(value)
        return data


@serialized
@dataclass(frozen=True)
class DataConfig:
    """An input set and the slice of it to use (``count`` None: everything from ``offset``)."""

    data: str
    offset: int = 0
    count: int | None = None


@dataclass(frozen=True)
class CalibrationConfig:
    inputs: DataConfig
    options: CalibrationOptions = CalibrationOptions()
    repeat: int = 1  # > 1: repeated calibration runs inside the pipeline and is recorded

    def to_json(self) -> dict[str, Any]:
        return {**self.inputs.to_json(), **self.options.to_json(), "repeat": self.repeat}


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline file: the model, the input sets, and each stage's options (``stages``, by stage name, for
    every stage of the registry that runs: required ones always, optional ones when their section is given)."""

    name: str
    path: Path | None
    model: ModelConfig
    calibration: CalibrationConfig
    stages: Mapping[str, Any] = field(default_factory=dict)
    preprocess: Preprocess | None = None
    evaluation: DataConfig | None = None
    runs_dir: Path = RUNS_DIR
    outputs: Mapping[str, OutputKind] = field(default_factory=dict)  # [evaluation] outputs: declared kinds
    isa: "IsaConfig" = field(default_factory=lambda: IsaConfig())  # [isa]: the quantize check across instruction sets

    def __post_init__(self) -> None:
        given = dict(self.stages)
        for stage in registered_stages():
            if stage.name not in given and not stage.optional:
                given[stage.name] = stage.options_type()
        object.__setattr__(self, "stages", MappingProxyType(given))

    def options(self, stage: str) -> Any:
        return self.stages[stage]

    def active_stages(self) -> tuple[Stage, ...]:
        """The stages this pipeline runs, in order."""
        return tuple(s for s in registered_stages() if s.name in self.stages)

    # the built-in stages' options, by name (a convenience; the pipeline itself reads ``stages``)
    @property
    def convert(self) -> ConvertOptions:
        return self.stages["convert"]

    @property
    def optimize(self) -> OptimizeOptions:
        return self.stages["optimize"]

    @property
    def quantize(self) -> QuantizeOptions:
        return self.stages["quantize"]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "path": str(self.path) if self.path else None, "runs_dir": str(self.runs_dir),
            "model": self.model.to_json(), **{name: options.to_json() for name, options in self.stages.items()},
            "preprocess": self.preprocess.to_json() if self.preprocess is not None else None,
            "calibration": self.calibration.to_json(),
            "evaluation": self.evaluation.to_json() if self.evaluation is not None else None,
            "outputs": {name: kind.value for name, kind in self.outputs.items()},
            **({"isa": self.isa.to_json()} if self.isa.active else {}),
        }


@dataclass(frozen=True)
class IsaConfig:
    """``[isa]``: the quantize check also computes the quantized model's outputs under these QEMU CPU models
    (``spread``, as written; resolved when the pipeline runs) and says when a verdict lies within the figures'
    spread across instruction sets (``qconsist.pipeline.isa.FigureSpread``); ``pin`` computes them with
    ``session.x64quantprecision=1``."""

    spread: tuple[str, ...] = ()
    pin: bool = False

    @property
    def active(self) -> bool:
        return bool(self.spread) or self.pin

    def to_json(self) -> dict[str, Any]:
        return {"spread": list(self.spread), "pin": self.pin}


def _isa(table: Table | None) -> IsaConfig:
    if table is None:
        return IsaConfig()
    config = IsaConfig(spread=table.strings("spread"), pin=bool(table.get("pin", bool, False)))
    table.finish()
    return config


def _resolve(base: Path, text: str) -> Path:
    if text.startswith(PACKAGE_PREFIX):
        return resolve_package_path(text)
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _data_source(base: Path, text: str) -> str:
    return text if text.startswith("package:") else str(_resolve(base, text))


def _model(table: Table | None, base: Path, origin: str) -> ModelConfig:
    if table is None:
        raise ConfigError(f"{origin}: [model] is missing; give source = \"<bundled name>\", prototxt + caffemodel, or onnx")
    source = table.get("source", str)
    prototxt = table.get("prototxt", str)
    caffemodel = table.get("caffemodel", str)
    onnx_path = table.get("onnx", str)
    table.finish()
    given = [k for k, v in (("source", source), ("prototxt/caffemodel", prototxt or caffemodel), ("onnx", onnx_path)) if v]
    if len(given) != 1:
        raise ConfigError(
            f"{origin}: [model] needs exactly one of source, prototxt + caffemodel, onnx (got {', '.join(given) or 'none'})"
        )
    if source:
        return ModelConfig(ModelKind.BUNDLED, source=source)
    if onnx_path:
        return ModelConfig(ModelKind.ONNX, onnx=_resolve(base, onnx_path))
    if not (prototxt and caffemodel):
        raise ConfigError(f"{origin}: [model] needs both prototxt and caffemodel")
    return ModelConfig(ModelKind.CAFFE, prototxt=_resolve(base, prototxt), caffemodel=_resolve(base, caffemodel))


def _data(table: Table, base: Path, required: bool) -> DataConfig | None:
    data = table.get("data", str)
    offset = table.get("offset", int, 0)
    count = table.get("count", int)
    if data is None:
        if required:
            raise table.error("data", "is missing: give \"package:photos\", a folder of images, or a .npy/.npz file")
        return None
    if offset < 0:
        raise table.error("offset", f"must be >= 0, got {offset}")
    if count is not None and count <= 0:
        raise table.error("count", f"must be > 0, got {count}")
    return DataConfig(_data_source(base, data), offset, count)


def _calibration(table: Table | None, base: Path, origin: str) -> CalibrationConfig:
    if table is None:
        raise ConfigError(f"{origin}: [calibration] is missing; give at least data = \"package:photos\" or a path")
    inputs = _data(table, base, required=True)
    repeat = table.get("repeat", int, 1)
    if not 1 <= repeat <= MAX_REPEAT:
        raise table.error("repeat", f"must be between 1 and {MAX_REPEAT}, got {repeat}")
    scenario = table.choice("scenario", DistributionScenario)
    execution = guard(table, lambda: _execution(table))
    options = guard(table, lambda: CalibrationOptions(
        method=table.choice("method", CalibrationMethodChoice, CalibrationMethodChoice.MINMAX),
        execution=execution, batch_size=table.get("batch_size", int, 1),
        symmetric=table.get("symmetric", bool), moving_average=table.get("moving_average", bool),
        averaging_constant=table.get("averaging_constant", float), num_bins=table.get("num_bins", int),
        num_quantized_bins=table.get("num_quantized_bins", int), percentile=table.get("percentile", float),
        scenario=scenario,
    ))
    table.finish()
    return CalibrationConfig(inputs=inputs, options=options, repeat=repeat)  # type: ignore[arg-type]


def _execution(table: Table) -> ExecutionOptions:
    """``provider`` and, flat beside it, the options that provider takes (``cudnn_conv_algo_search`` …)."""
    provider = table.get("provider", str, "cpu")
    if provider.lower() not in PROVIDERS:
        raise table.error("provider", f"must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    spec = provider_spec(provider)
    every = {name for other in PROVIDERS.values() for name in other.options}
    given = {}
    for name in sorted(every):
        value = table.get(name, (str, bool, int))
        if value is None:
            continue
        if name not in spec.options:
            owners = " or ".join(f'"{p.name}"' for p in PROVIDERS.values() if name in p.options)
            raise table.error(name, f"applies to provider = {owners} only")
        given[name] = value
    return ExecutionOptions(spec.name, given)


def _check_name(name: str, origin: str) -> None:
    """A pipeline's name labels its run directories (``<runs_dir>/<name>-<time>-<random>``): a path, or a name
    that would hide them, is refused saying so."""
    if len(name) > MAX_LABEL:
        raise ConfigError(f"{origin}: name {shorten(name, 60)!r} is {len(name)} characters long; a name has at most "
                          f"{MAX_LABEL} (it labels the run directories: <runs_dir>/<name>-<time>-<random>)")
    parts = [part for part in re.split(r"[/\\]", name)]
    if len(parts) > 1:
        where = "leads out of the runs directory" if ".." in parts or name.startswith(("/", "\\")) else "would nest its runs in a folder"
        raise ConfigError(f"{origin}: name {shorten(name)!r} is a path that {where}; the name labels the run directories "
                          "(<runs_dir>/<name>-<time>-<random>): give a plain name, without '/' or '\\'")
    if name.startswith("."):
        raise ConfigError(f"{origin}: name {shorten(name)!r} starts with '.', which would hide its run directories (and '..' "
                          "names the folder above them): start it with a letter or digit")


def parse_pipeline(data: dict[str, Any], path: Path | None = None, origin: str | None = None) -> PipelineConfig:
    """Build a ``PipelineConfig`` from parsed TOML; ``path`` is the file (relative paths start at its folder)."""
    origin = origin or (str(path) if path else "pipeline")
    base = path.parent if path else Path.cwd()
    top = Table(data, "", origin)
    name = top.get("name", str) or (path.stem if path else "pipeline")
    _check_name(name, origin)
    runs_dir = Path(top.get("runs_dir", str, str(RUNS_DIR))).expanduser()  # an output: relative to the working directory
    model = _model(top.sub("model"), base, origin)
    stages = {}
    for stage in registered_stages():
        table = top.sub(stage.name)
        if table is not None or not stage.optional:
            stages[stage.name] = stage.parse(table, base)
    pre_table = top.sub("preprocess")
    preprocess = None
    if pre_table is not None:
        preprocess = guard(pre_table, lambda: Preprocess.from_dict(pre_table.data))
    calibration = _calibration(top.sub("calibration"), base, origin)
    evaluation = None
    outputs: dict[str, OutputKind] = {}
    eval_table = top.sub("evaluation")
    if eval_table is not None:
        declared = eval_table.get("outputs", dict)
        if declared is not None:
            outputs = guard(eval_table, lambda: parse_kinds(declared, "[evaluation] outputs"))
        evaluation = _data(eval_table, base, required=declared is None)  # only outputs: the calibration inputs
        eval_table.finish()
    isa = _isa(top.sub("isa"))
    top.finish()
    return PipelineConfig(
        name=name, path=path, model=model, calibration=calibration, stages=stages, preprocess=preprocess,
        evaluation=evaluation, runs_dir=runs_dir, outputs=outputs, isa=isa,
    )


def load_pipeline(path: Path | str) -> PipelineConfig:
    """Read and validate a pipeline file."""
    path = Path(path)
    return parse_pipeline(read_toml(path, "pipeline file"), path.resolve())
