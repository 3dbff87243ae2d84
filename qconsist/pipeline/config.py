"""Pipeline files (TOML) → frozen, validated dataclasses. Unknown keys are errors naming their path.

Relative paths in the file are relative to the file's folder. See the README ("Pipeline file") for every
key and its default; ``PipelineConfig.to_json`` is what the manifest records.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from qconsist.errors import ConfigError
from qconsist.inference.session import ConvAlgoSearch
from qconsist.inputs.preprocess import Preprocess
from qconsist.stages.convert import ConvertOptions
from qconsist.stages.optimize import GraphLevel, OptimizeMethod, OptimizeOptions
from qconsist.stages.quantize import (
    CalibrationMethodChoice,
    CalibrationOptions,
    DistributionScenario,
    Provider,
    QuantFormatChoice,
    QuantizeOptions,
    QuantTypeChoice,
)
from qconsist.tomlfile import read_toml

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


@dataclass(frozen=True)
class DataConfig:
    """An input set and the slice of it to use (``count`` None: everything from ``offset``)."""

    data: str
    offset: int = 0
    count: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data, "offset": self.offset, "count": self.count}


@dataclass(frozen=True)
class CalibrationConfig:
    inputs: DataConfig
    options: CalibrationOptions = CalibrationOptions()
    repeat: int = 1  # > 1: repeated calibration runs inside the pipeline and is recorded

    def to_json(self) -> dict[str, Any]:
        return {**self.inputs.to_json(), **self.options.to_json(), "repeat": self.repeat}


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    path: Path | None
    model: ModelConfig
    calibration: CalibrationConfig
    convert: ConvertOptions = ConvertOptions()
    optimize: OptimizeOptions = OptimizeOptions()
    preprocess: Preprocess | None = None
    quantize: QuantizeOptions = QuantizeOptions()
    evaluation: DataConfig | None = None
    runs_dir: Path = Path("runs")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "path": str(self.path) if self.path else None, "runs_dir": str(self.runs_dir),
            "model": self.model.to_json(), "convert": self.convert.to_json(), "optimize": self.optimize.to_json(),
            "preprocess": self.preprocess.to_json() if self.preprocess else None,
            "calibration": self.calibration.to_json(), "quantize": self.quantize.to_json(),
            "evaluation": self.evaluation.to_json() if self.evaluation else None,
        }


class _Table:
    """A TOML table being read: typed access by key, and a check that nothing unknown is left."""

    def __init__(self, data: Any, where: str, origin: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{origin}: [{where}] must be a table")
        self.data = dict(data)
        self.where = where
        self.origin = origin
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.origin}: {self.path(key)} {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(key, f"must be {_kind_name(kinds)}, got {value!r}")
        if not isinstance(value, kinds):
            raise self.error(key, f"must be {_kind_name(kinds)}, got {value!r}")
        return value

    def choice(self, key: str, enum: type[Enum], default: Any = None) -> Any:
        value = self.get(key, str)
        if value is None:
            return default
        for member in enum:  # type: ignore[attr-defined]
            if member.value.lower() == value.lower():
                return member
        raise self.error(key, f"must be one of {', '.join(m.value for m in enum)}, got {value!r}")  # type: ignore[attr-defined]

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [])
        if not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a list of strings")
        return tuple(value)

    def sub(self, key: str) -> "_Table | None":
        self.seen.add(key)
        if key not in self.data:
            return None
        return _Table(self.data[key], self.path(key), self.origin)

    def finish(self, known_extra: tuple[str, ...] = ()) -> None:
        unknown = sorted(set(self.data) - self.seen - set(known_extra))
        if unknown:
            known = ", ".join(sorted(self.seen | set(known_extra)))
            raise ConfigError(f"{self.origin}: unknown key '{self.path(unknown[0])}' (known in [{self.where or 'top level'}]: {known})")


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _resolve(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _data_source(base: Path, text: str) -> str:
    return text if text.startswith("package:") else str(_resolve(base, text))


def _model(table: _Table | None, base: Path, origin: str) -> ModelConfig:
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


def _data(table: _Table, base: Path, required: bool) -> DataConfig | None:
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


def _guard(table: _Table, build: Callable[[], Any]) -> Any:
    try:
        return build()
    except ConfigError as exc:
        if exc.message.startswith(f"{table.origin}: "):
            raise
        raise ConfigError(f"{table.origin}: {exc.message}") from None


def _calibration(table: _Table | None, base: Path, origin: str) -> CalibrationConfig:
    if table is None:
        raise ConfigError(f"{origin}: [calibration] is missing; give at least data = \"package:photos\" or a path")
    inputs = _data(table, base, required=True)
    repeat = table.get("repeat", int, 1)
    if not 1 <= repeat <= MAX_REPEAT:
        raise table.error("repeat", f"must be between 1 and {MAX_REPEAT}, got {repeat}")
    scenario = table.choice("scenario", DistributionScenario)
    options = _guard(table, lambda: CalibrationOptions(
        method=table.choice("method", CalibrationMethodChoice, CalibrationMethodChoice.MINMAX),
        provider=table.choice("provider", Provider, Provider.CPU),
        symmetric=table.get("symmetric", bool), moving_average=table.get("moving_average", bool),
        averaging_constant=table.get("averaging_constant", float), num_bins=table.get("num_bins", int),
        num_quantized_bins=table.get("num_quantized_bins", int), percentile=table.get("percentile", float),
        scenario=scenario,
        cudnn_conv_algo_search=table.choice("cudnn_conv_algo_search", ConvAlgoSearch),
        use_tf32=table.get("use_tf32", bool),
        cudnn_conv_use_max_workspace=table.get("cudnn_conv_use_max_workspace", bool),
    ))
    table.finish()
    return CalibrationConfig(inputs=inputs, options=options, repeat=repeat)  # type: ignore[arg-type]


def _quantize(table: _Table | None) -> QuantizeOptions:
    if table is None:
        return QuantizeOptions()
    t = table
    options = _guard(t, lambda: QuantizeOptions(
        format=t.choice("format", QuantFormatChoice, QuantFormatChoice.QDQ),
        per_channel=t.get("per_channel", bool, False),
        activation_type=t.choice("activation_type", QuantTypeChoice, QuantTypeChoice.INT8),
        weight_type=t.choice("weight_type", QuantTypeChoice, QuantTypeChoice.INT8),
        reduce_range=t.get("reduce_range", bool, False),
        activation_symmetric=t.get("activation_symmetric", bool, False),
        weight_symmetric=t.get("weight_symmetric", bool),
        op_types=t.strings("op_types"), nodes_to_exclude=t.strings("nodes_to_exclude"),
        allow_invalid_scales=t.get("allow_invalid_scales", bool, False),
        min_top1_agreement=t.get("min_top1_agreement", float), max_abs_diff=t.get("max_abs_diff", float),
    ))
    t.finish()
    return options


def _optimize(table: _Table | None) -> OptimizeOptions:
    if table is None:
        return OptimizeOptions()
    t = table
    options = _guard(t, lambda: OptimizeOptions(
        method=t.choice("method", OptimizeMethod, OptimizeMethod.PRE_PROCESS),
        level=t.choice("level", GraphLevel, GraphLevel.BASIC),
        skip_optimization=t.get("skip_optimization", bool, False), symbolic_shape=t.get("symbolic_shape", bool, False),
        atol=t.get("atol", float, OptimizeOptions.atol), rtol=t.get("rtol", float, OptimizeOptions.rtol),
    ))
    t.finish()
    return options


def _convert(table: _Table | None) -> ConvertOptions:
    if table is None:
        return ConvertOptions()
    t = table
    options = _guard(t, lambda: ConvertOptions(
        opset=t.get("opset", int, ConvertOptions.opset), dynamic_batch=t.get("dynamic_batch", bool, False),
        check=t.get("check", bool, True),
    ))
    t.finish()
    return options


def parse_pipeline(data: dict[str, Any], path: Path | None = None, origin: str | None = None) -> PipelineConfig:
    """Build a ``PipelineConfig`` from parsed TOML; ``path`` is the file (relative paths start at its folder)."""
    origin = origin or (str(path) if path else "pipeline")
    base = path.parent if path else Path.cwd()
    top = _Table(data, "", origin)
    name = top.get("name", str) or (path.stem if path else "pipeline")
    runs_dir = Path(top.get("runs_dir", str, "runs")).expanduser()  # an output: relative to the working directory
    model = _model(top.sub("model"), base, origin)
    convert = _convert(top.sub("convert"))
    optimize = _optimize(top.sub("optimize"))
    pre_table = top.sub("preprocess")
    preprocess = None
    if pre_table is not None:
        preprocess = _guard(pre_table, lambda: Preprocess.from_dict(pre_table.data))
    calibration = _calibration(top.sub("calibration"), base, origin)
    quantize = _quantize(top.sub("quantize"))
    evaluation = None
    eval_table = top.sub("evaluation")
    if eval_table is not None:
        evaluation = _data(eval_table, base, required=True)
        eval_table.finish()
    top.finish()
    if model.kind is ModelKind.ONNX and "convert" in data:
        raise ConfigError(f"{origin}: [convert] does not apply to an ONNX model (convert is skipped)")
    return PipelineConfig(
        name=name, path=path, model=model, calibration=calibration, convert=convert, optimize=optimize,
        preprocess=preprocess, quantize=quantize, evaluation=evaluation, runs_dir=runs_dir,
    )


def load_pipeline(path: Path | str) -> PipelineConfig:
    """Read and validate a pipeline file."""
    path = Path(path)
    return parse_pipeline(read_toml(path, "pipeline file"), path.resolve())
