"""Stage quantize: calibration, then ``onnxruntime.quantization.quantize_static``, then validation.

ORT's ``extra_options`` string bag is hidden behind typed options: ``CalibrationOptions`` (method and its
parameters, execution provider) and ``QuantizeOptions`` (format, types, per-channel, symmetry, gates).

Steps:

1. Calibration: ORT's calibrator (``create_calibrator``) runs the float model over the calibration
   ``InputSet`` (streamed one sample at a time) and computes every tensor's range. Its session is made by
   qconsist (``CalibrationOptions.session_options``: the calibration's execution options, graph
   optimizations off as ORT's calibrator has them, one intra-op thread unless a count is given), so that
   the ranges, and the quantized model's md5, do not change with the machine's core count
   (``qconsist.threads``).
2. The ranges go to ``quantize_static`` through its calibration cache (so calibration happens once, with
   exactly the recorded parameters), which writes the quantized model (atomically, via a temporary file).
3. The calibration table is read back from the quantized model (``qconsist.stages.calibration_table``) and
   validated: a NaN, infinite, zero or negative scale is an issue naming its tensor and nodes. Issues fail
   the stage (``FidelityError``) unless ``allow_invalid_scales`` is set; they are recorded either way.
4. The quantized model is compared with the float model on the evaluation inputs, each output judged for
   what it is (``qconsist.compare.kinds``: declared in the pipeline's ``[evaluation] outputs`` or read from the
   float graph): SQNR, cosine and greatest difference of every output and part, top-1 agreement of class
   scores. ``min_sqnr_db`` (default 15 dB) is the floor every output and part must reach: one below it fails
   the check, recorded with the run (``QuantizeResult.failures``; the run is kept for ``quant-error`` and the
   gate); ``min_top1_agreement`` / ``max_abs_diff`` raise when set.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

import onnx

from qconsist.onnxfile import INVENTED_MARK, ai_onnx_opset, node_label, read_onnx
from qconsist.stages.calibration_table import CalibrationTable, ScaleIssue, build_table, quantized_nodes
from qconsist.errors import ConfigError, FidelityError, InputError, OutputError, UnsupportedModelError
from qconsist.inputs.inputset import InputSet, check_batch_size
from qconsist.compare import OutputComparison, OutputKind, compare_outputs, judged_outputs
from qconsist.compare.statistics import ZERO_SIGNAL, sqnr_phrase
from qconsist.inference.session import (
    ExecutionOptions, OptimizationLevel, create_session, input_specs, measurement_options, ort_logged, outputs_of,
    require_provider,
)
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.atomic import write_atomic
from qconsist.tomlfile import guard
from qconsist.stages.base import StageRecord
from qconsist.stages.convert import refuse_quantized
from qconsist.store.hashing import hash_artifact
from qconsist.store.scratch import scratch_dir

log = logging.getLogger(__name__)


# The floor of every final output's (and part's) SQNR against the float model, in dB: a healthy int8
# quantization measures 28–43 dB on the models here (open_nsfw 41.4, fcn_head 41.0, NudeNet's boxes 27.9); a
# destroyed output measures near 0 dB.
DEFAULT_MIN_SQNR_DB = 15.0


class NothingQuantizedError(ConfigError):
    """quantize_static wrote a model without a quantized node (every quantizable node excluded, or none selected)."""


class QuantFormatChoice(str, Enum):
    QDQ = "QDQ"
    QOPERATOR = "QOperator"


class QuantTypeChoice(str, Enum):
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    UINT16 = "uint16"

    @property
    def signed(self) -> bool:
        return self in (QuantTypeChoice.INT8, QuantTypeChoice.INT16)


class CalibrationMethodChoice(str, Enum):
    MINMAX = "MinMax"
    ENTROPY = "Entropy"
    PERCENTILE = "Percentile"
    DISTRIBUTION = "Distribution"


class DistributionScenario(str, Enum):
    SAME = "same"
    P3 = "p3"


# Parameters each calibration method takes, with ORT's defaults (onnxruntime.quantization.calibrate).
METHOD_PARAMETERS: dict[CalibrationMethodChoice, dict[str, Any]] = {
    CalibrationMethodChoice.MINMAX: {"symmetric": False, "moving_average": False, "averaging_constant": 0.01},
    CalibrationMethodChoice.ENTROPY: {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128},
    CalibrationMethodChoice.PERCENTILE: {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    CalibrationMethodChoice.DISTRIBUTION: {"num_bins": 2048, "scenario": DistributionScenario.SAME},
}
_ALL_PARAMETERS = ("symmetric", "moving_average", "averaging_constant", "num_bins", "num_quantized_bins", "percentile", "scenario")


@dataclass(frozen=True)
class CalibrationOptions:
    """How tensor ranges are measured. A parameter left None takes its method's ORT default."""

    method: CalibrationMethodChoice = CalibrationMethodChoice.MINMAX
    # where the calibration session runs; on CUDA, restricting the cuDNN algorithm search (HEURISTIC or
    # DEFAULT) is the fix for autotuner-dependent calibration
    execution: ExecutionOptions = ExecutionOptions()
    batch_size: int = 1  # samples per calibration step (the model needs a dynamic batch for more than 1)
    symmetric: bool | None = None
    moving_average: bool | None = None
    averaging_constant: float | None = None
    num_bins: int | None = None
    num_quantized_bins: int | None = None
    percentile: float | None = None
    scenario: DistributionScenario | None = None

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        allowed = METHOD_PARAMETERS[self.method]
        for name in _ALL_PARAMETERS:
            if getattr(self, name) is not None and name not in allowed:
                raise ConfigError(
                    f"calibration.{name} does not apply to method {self.method.value} "
                    f"(its parameters: {', '.join(allowed)})"
                )
        if self.num_bins is not None and self.num_bins < 2:
            raise ConfigError(f"calibration.num_bins must be >= 2, got {self.num_bins}")
        if self.num_quantized_bins is not None and self.num_quantized_bins < 2:
            raise ConfigError(f"calibration.num_quantized_bins must be >= 2, got {self.num_quantized_bins}")
        if self.percentile is not None and not 0 < self.percentile <= 100:
            raise ConfigError(f"calibration.percentile must be in (0, 100], got {self.percentile}")
        if self.averaging_constant is not None and not 0 < self.averaging_constant <= 1:
            raise ConfigError(f"calibration.averaging_constant must be in (0, 1], got {self.averaging_constant}")

    def resolved(self) -> dict[str, Any]:
        """The method's parameters with defaults filled in: exactly what the calibrator receives."""
        values = {}
        for name, default in METHOD_PARAMETERS[self.method].items():
            value = getattr(self, name)
            value = default if value is None else value
            values[name] = value.value if isinstance(value, Enum) else value
        return values

    @property
    def provider(self) -> str:
        return self.execution.provider

    def ort_providers(self) -> list:
        """The ``providers`` argument of the calibration session (UnavailableError where the provider cannot run)."""
        require_provider(self.execution.provider)
        return self.execution.ort_providers()

    def session_options(self) -> ExecutionOptions:
        """How the calibration session runs: the execution options with graph optimizations off (as ORT's
        calibrator opens it) and, unless given, one intra-op thread."""
        return measurement_options(self.execution).with_options(graph_optimization_level=OptimizationLevel.DISABLE)

    def to_json(self) -> dict[str, Any]:
        data = {"method": self.method.value, "provider": self.execution.provider, **self.resolved(),
                "execution": self.execution.to_json()}
        if self.batch_size != 1:
            data["batch_size"] = self.batch_size
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CalibrationOptions":
        """The options a manifest recorded (``to_json``; a pipeline's ``[calibration]`` as recorded also holds
        its data keys, which are not options and are left aside)."""
        try:
            method = CalibrationMethodChoice(data.get("method", CalibrationMethodChoice.MINMAX.value))
            execution = (ExecutionOptions.from_json(data["execution"]) if isinstance(data.get("execution"), Mapping)
                         else ExecutionOptions(str(data.get("provider", "cpu"))))
            values = {name: data[name] for name in METHOD_PARAMETERS[method] if data.get(name) is not None}
            if "scenario" in values:
                values["scenario"] = DistributionScenario(values["scenario"])
            return cls(method=method, execution=execution, batch_size=int(data.get("batch_size", 1)), **values)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"recorded calibration options are not valid: {exc}") from None


@dataclass(frozen=True)
class QuantizeOptions:
    """How the model is quantized. Defaults follow ``quantize_static``'s own."""

    format: QuantFormatChoice = QuantFormatChoice.QDQ
    per_channel: bool = False
    activation_type: QuantTypeChoice = QuantTypeChoice.INT8
    weight_type: QuantTypeChoice = QuantTypeChoice.INT8
    reduce_range: bool = False
    activation_symmetric: bool = False
    weight_symmetric: bool | None = None  # None: symmetric for signed weight types (ORT's rule)
    op_types: tuple[str, ...] = ()  # empty: every operator ORT can quantize
    nodes_to_exclude: tuple[str, ...] = ()
    allow_invalid_scales: bool = False  # NaN/Inf/zero scales are recorded but do not fail the stage
    min_top1_agreement: float | None = None  # gate on the evaluation inputs; None: record only
    max_abs_diff: float | None = None  # gate on the evaluation inputs; None: record only
    min_sqnr_db: float | None = DEFAULT_MIN_SQNR_DB  # every output and part against the float model; None: record only

    def __post_init__(self) -> None:
        if self.activation_type is QuantTypeChoice.INT8 and self.weight_type is QuantTypeChoice.UINT8:
            raise ConfigError("quantize: activation_type int8 with weight_type uint8 is not supported by onnxruntime")
        sixteen = {QuantTypeChoice.INT16, QuantTypeChoice.UINT16}
        if (self.activation_type in sixteen or self.weight_type in sixteen) and self.format is not QuantFormatChoice.QDQ:
            raise ConfigError("quantize: 16-bit activation_type/weight_type need format QDQ")
        if self.min_top1_agreement is not None and not 0 <= self.min_top1_agreement <= 1:
            raise ConfigError(f"quantize.min_top1_agreement must be in [0, 1], got {self.min_top1_agreement}")
        if self.max_abs_diff is not None and not self.max_abs_diff >= 0:
            raise ConfigError(f"quantize.max_abs_diff must be >= 0, got {self.max_abs_diff}")
        if self.min_sqnr_db is not None and not math.isfinite(self.min_sqnr_db):
            raise ConfigError(f"quantize.min_sqnr_db must be a finite number of dB (or \"off\"), got {self.min_sqnr_db}")

    @property
    def resolved_weight_symmetric(self) -> bool:
        return self.weight_type.signed if self.weight_symmetric is None else self.weight_symmetric

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format.value, "per_channel": self.per_channel,
            "activation_type": self.activation_type.value, "weight_type": self.weight_type.value,
            "reduce_range": self.reduce_range, "activation_symmetric": self.activation_symmetric,
            "weight_symmetric": self.resolved_weight_symmetric, "op_types": list(self.op_types),
            "nodes_to_exclude": list(self.nodes_to_exclude), "allow_invalid_scales": self.allow_invalid_scales,
            "min_top1_agreement": self.min_top1_agreement, "max_abs_diff": self.max_abs_diff,
            "min_sqnr_db": self.min_sqnr_db,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "QuantizeOptions":
        """The options a manifest recorded (``to_json``; ``min_sqnr_db`` null is "off"); unknown keys are errors."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"recorded quantize options have unknown key(s) {', '.join(unknown)}")
        try:
            values = dict(data)
            for name in ("format", "activation_type", "weight_type"):
                if name in values:
                    values[name] = (QuantFormatChoice if name == "format" else QuantTypeChoice)(values[name])
            for name in ("op_types", "nodes_to_exclude"):
                if name in values:
                    values[name] = tuple(str(v) for v in values[name])
            return cls(**values)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"recorded quantize options are not valid: {exc}") from None


class InputSetReader:
    """An ORT ``CalibrationDataReader`` over an ``InputSet``: one step of ``batch_size`` samples at a time,
    samples counted."""

    def __init__(self, inputs: InputSet, progress_handle: Any = None, batch_size: int = 1) -> None:
        self._iter = (step for _, step in inputs.batches(batch_size))
        self._handle = progress_handle
        self.count = 0

    def get_next(self) -> dict | None:
        step = next(self._iter, None)
        if step is not None:
            first = next(iter(step.values()))
            rows = int(first.shape[0]) if first.ndim else 1
            self.count += rows
            if self._handle is not None:
                self._handle.advance(rows)
        return step

    def __iter__(self):  # ORT's CalibrationDataReader protocol
        return self

    def __next__(self) -> dict:
        sample = self.get_next()
        if sample is None:
            raise StopIteration
        return sample


@dataclass
class QuantizeResult:
    path: Path
    seconds: float
    calibration_seconds: float
    params: dict[str, Any]
    table: CalibrationTable
    issues: list[ScaleIssue]
    ranges_path: Path | None = None
    check: OutputComparison | None = None
    failures: list[str] = field(default_factory=list)  # outputs below the SQNR floor, one line each

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "seconds": self.seconds, "calibration_seconds": self.calibration_seconds,
            "params": self.params, "issues": [i.to_json() for i in self.issues],
            "check": self.check.to_json() if self.check is not None else None, "failures": list(self.failures),
        }


def _ort_method(calibration: CalibrationOptions):
    from onnxruntime.quantization import CalibrationMethod

    return CalibrationMethod[calibration.method.value]


def _ort_enums(options: QuantizeOptions):
    """ORT's enums for the format and the activation and weight types."""
    from onnxruntime.quantization import QuantFormat, QuantType

    types = {
        QuantTypeChoice.INT8: QuantType.QInt8, QuantTypeChoice.UINT8: QuantType.QUInt8,
        QuantTypeChoice.INT16: QuantType.QInt16, QuantTypeChoice.UINT16: QuantType.QUInt16,
    }
    quant_format = QuantFormat.QDQ if options.format is QuantFormatChoice.QDQ else QuantFormat.QOperator
    return quant_format, types[options.activation_type], types[options.weight_type]


class _OnnxruntimeAdvice(logging.Filter):
    """onnxruntime.quantization logs advice on the root logger ("Please consider to run pre-processing …",
    meant for its own scripts): kept at debug level under qconsist's logger, off the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "root" and f"{os.sep}onnxruntime{os.sep}" in record.pathname:
            log.debug("onnxruntime.quantization: %s", record.getMessage())
            return False
        return True


@contextlib.contextmanager
def _onnxruntime_advice_kept():
    advice = _OnnxruntimeAdvice()
    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


def calibrate(model: Path, inputs: InputSet, calibration: CalibrationOptions, workdir: Path, progress: Progress = NULL_PROGRESS):
    """Run ORT's calibrator over ``inputs``; returns its ``TensorsData`` (tensor → range)."""
    from onnxruntime.quantization.calibrate import create_calibrator
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    if len(inputs) == 0:
        raise InputError(f"calibration set {inputs.source} is empty")
    providers = calibration.ort_providers()
    checked = inputs.checked(input_specs(model), calibration.batch_size)
    op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))
    chatter = io.StringIO()  # ORT's histogram calibrators print; the library does not
    # the calibrator opens its own sessions (onnxruntime's default log level): their log is captured too
    with ort_logged(), progress.task("calibrating", len(checked)) as handle, contextlib.redirect_stdout(chatter), \
            warnings.catch_warnings():
        calibrator = create_calibrator(
            Path(model), op_types, augmented_model_path=str(workdir / "augmented.onnx"),
            calibrate_method=_ort_method(calibration), providers=providers,
            extra_options=calibration.resolved(),
        )
        # ORT's calibrator opened the augmented model with onnxruntime's default thread count: run it as recorded instead
        calibrator.infer_session = create_session(workdir / "augmented.onnx", calibration.session_options())
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN warnings: NaN ranges are refused below
        calibrator.collect_data(InputSetReader(checked, handle, calibration.batch_size))
        ranges = calibrator.compute_data()
    nan = sorted(name for name, (low, high) in _ranges(ranges).items() if math.isnan(low) or math.isnan(high))
    if nan:
        shown = ", ".join(nan[:3]) + (f" and {len(nan) - 3} more" if len(nan) > 3 else "")
        raise FidelityError(
            f"calibration measured a NaN range for tensor(s) {shown}: the model computes NaN from the calibration "
            f"inputs ({inputs.source}), so no scale can be chosen"
        )
    if chatter.getvalue():
        log.debug("onnxruntime calibrator: %s", chatter.getvalue().strip())
    return ranges


def load_ranges(path: Path):  # -> onnxruntime's TensorsData
    """A calibration cache written by ``quantize_model`` (onnxruntime's ``save_tensors_data``), read back."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    try:
        return load_tensors_data(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read the calibration ranges {path}: {exc}") from None


def _ranges(tensors_data) -> dict[str, tuple[float, float]]:
    found = {}
    for name in tensors_data:
        low, high = tensors_data[name].range_value
        found[name] = (float(low.reshape(-1)[0]) if hasattr(low, "reshape") else float(low),
                       float(high.reshape(-1)[0]) if hasattr(high, "reshape") else float(high))
    return found


def _calibrated_ranges(source: Path, calibration_inputs: InputSet | None, calibration: CalibrationOptions,
                       ranges: Path | None, cache: Path, progress: Progress):  # -> onnxruntime's TensorsData
    """The ranges quantize_static reads, written to ``cache``: calibrated, or ``ranges`` recorded earlier."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    if ranges is not None:
        tensors_data = load_ranges(Path(ranges))
        cache.write_bytes(Path(ranges).read_bytes())
        return tensors_data
    if calibration_inputs is None:
        raise ConfigError("quantize_model needs calibration inputs or recorded ranges")
    tensors_data = calibrate(source, calibration_inputs, calibration, cache.parent, progress)
    save_tensors_data(tensors_data, cache)
    # ORT writes the tensors in its calibrator's set order, which Python's string hashing changes from
    # process to process: the recorded file is the same data with its keys sorted, the same bytes in every
    # process
    cache.write_text(json.dumps(json.loads(cache.read_text()), sort_keys=True))
    return tensors_data


def _ort_arguments(options: QuantizeOptions, calibration: CalibrationOptions) -> dict[str, Any]:
    """quantize_static's keyword arguments besides the calibration cache, from the options."""
    quant_format, activation_type, weight_type = _ort_enums(options)
    return {
        "quant_format": quant_format, "op_types_to_quantize": list(options.op_types) or None,
        "per_channel": options.per_channel, "reduce_range": options.reduce_range, "activation_type": activation_type,
        "weight_type": weight_type, "nodes_to_exclude": list(options.nodes_to_exclude) or None,
        "calibrate_method": _ort_method(calibration),
        "extra_options": {"ActivationSymmetric": options.activation_symmetric,
                          "WeightSymmetric": options.resolved_weight_symmetric},
    }


def _quantize_static(source: Path, output: Path, arguments: dict[str, Any], cache: Path) -> None:
    """onnxruntime's quantize_static into ``output`` (atomically), its failures mapped to ``UnsupportedModelError``."""
    from onnxruntime.quantization import quantize_static

    def write(target: Path) -> None:
        quantize_static(str(source), str(target), None, **arguments, calibration_cache_path=str(cache))

    try:
        with warnings.catch_warnings(), ort_logged(), _onnxruntime_advice_kept():  # numpy's divide/cast warnings: validated below
            warnings.simplefilter("ignore", RuntimeWarning)
            write_atomic(output, write)
    except (ValueError, TypeError, KeyError) as exc:
        raise UnsupportedModelError(f"quantize_static cannot quantize {source}: {exc}") from None
    except AssertionError as exc:  # its graph checks assert ("Graph is not a DAG")
        raise UnsupportedModelError(f"quantize_static cannot quantize {source}: {_why_assertion(source, exc)}") from None


def _params(options: QuantizeOptions, calibration: CalibrationOptions, arguments: dict[str, Any],
            calibration_inputs: InputSet | None, ranges: Path | None) -> dict[str, Any]:
    """What the manifest records of a quantization: the options, where the ranges came from, ORT's arguments."""
    return {
        **options.to_json(), "calibration": calibration.to_json(),
        **({"calibration_count": len(calibration_inputs)} if ranges is None else {"calibration_ranges": str(ranges)}),
        "tool": "onnxruntime.quantization.quantize_static",
        "ort_arguments": {
            **{key: arguments[key].name for key in ("quant_format", "activation_type", "weight_type")},
            "calibrate_method": arguments["calibrate_method"].name,
            "calibration_providers": calibration.ort_providers() if ranges is None else calibration.execution.ort_providers(),
            "calibration_session": calibration.session_options().to_json(), "extra_options": arguments["extra_options"],
        },
    }


def _refuse_invalid(issues: list[ScaleIssue], options: QuantizeOptions) -> None:
    if issues and not options.allow_invalid_scales:
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        raise FidelityError(
            f"quantization produced invalid parameters: {issues[0].message()}{more}; "
            "set [quantize] allow_invalid_scales = true to keep the model anyway"
        )


def quantize_model(
    source: Path,
    output: Path,
    calibration_inputs: InputSet | None,
    options: QuantizeOptions = QuantizeOptions(),
    calibration: CalibrationOptions = CalibrationOptions(),
    evaluation: InputSet | None = None,
    ranges_output: Path | None = None,
    progress: Progress = NULL_PROGRESS,
    output_kinds: Mapping[str, OutputKind] | None = None,
    ranges: Path | None = None,
) -> QuantizeResult:
    """Calibrate ``source`` on ``calibration_inputs``, quantize it into ``output`` and validate the result
    (``output_kinds``: the outputs' declared kinds, the others read from the float graph).

    ``ranges``: a calibration cache recorded by an earlier calibration of ``source`` with ``calibration`` (a
    pipeline run's ``quantize/calibration_ranges.json``): then nothing is calibrated (``calibration_inputs`` is
    not read) and quantize_static reads those ranges, so quantizations that differ only in ``options`` (the
    nodes excluded, say) differ in nothing else."""
    source, output = Path(source), Path(output)
    check_selection(source, options)
    arguments = _ort_arguments(options, calibration)
    start = time.perf_counter()
    with scratch_dir("qconsist-quantize-") as tmp:
        cache = Path(tmp) / "ranges.json"
        tensors_data = _calibrated_ranges(source, calibration_inputs, calibration, ranges, cache, progress)
        calibration_seconds = time.perf_counter() - start
        _quantize_static(source, output, arguments, cache)
        if ranges_output is not None:
            write_atomic(Path(ranges_output), lambda target: target.write_bytes(cache.read_bytes()))
    seconds = time.perf_counter() - start
    quantized = read_onnx(output, external_data=True, what="the quantized model", error=OutputError)
    if not quantized_nodes(quantized):
        raise NothingQuantizedError(f"quantize_static quantized nothing: {_why_nothing(source, options)}")
    table = build_table(quantized, _ranges(tensors_data))
    issues = table.issues()
    result = QuantizeResult(
        path=output, seconds=seconds, calibration_seconds=calibration_seconds,
        params=_params(options, calibration, arguments, calibration_inputs, ranges), table=table,
        issues=issues, ranges_path=Path(ranges_output) if ranges_output else None,
    )
    log.info("quantized %s -> %s in %.2f s (%d table entries, %d issues)", source, output, seconds, len(table.entries), len(issues))
    _refuse_invalid(issues, options)
    if evaluation is not None:
        result.check = check_quantized(source, output, evaluation, options, output_kinds)
        result.failures = floor_failures(result.check, options.min_sqnr_db)
    return result


def floor_failures(comparison: OutputComparison, min_sqnr_db: float | None, against: str = "the float model") -> list[str]:
    """One line per output or part whose SQNR is below ``min_sqnr_db``, lowest first."""
    return [f"output {j.label} ({j.target.kind_name}): {_figure(j)} against {against}, below the floor of "
            f"{min_sqnr_db:g} dB" + (f" ({j.noise.nonfinite} element(s) NaN or Inf on one side)" if j.noise.nonfinite else "")
            for j in comparison.below(min_sqnr_db)]


def _figure(judgement) -> str:
    """"SQNR 3.2 dB", or for a reference of zeros "zero signal (…), greatest difference 0.25" (no SQNR)."""
    if judgement.figure == ZERO_SIGNAL:
        return f"{sqnr_phrase(None, ZERO_SIGNAL)}, greatest difference {judgement.noise.max_abs:.4g},"
    return sqnr_phrase(judgement.sqnr_db)


def _why_assertion(source: Path, exc: AssertionError) -> str:
    """What made quantize_static assert, where the model shows it: an output that is also an input (the Q/DQ pair
    it puts on the input then feeds the output it renames, a cycle)."""
    graph = read_onnx(source).graph
    passed = sorted({o.name for o in graph.output} & {i.name for i in graph.input})
    if passed:
        return (f"its output(s) {', '.join(passed)} are also its input(s) (passed through unchanged), which onnxruntime's "
                f"quantizer turns into a cycle ({exc}); leave such an output out of the model")
    return f"onnxruntime's quantizer failed its own check: {exc or 'AssertionError'}"


def quantizable_op_types(options: QuantizeOptions) -> list[str]:
    """The operators onnxruntime quantizes in ``options.format``: in QDQ, what ``quantize_static`` quantizes when
    given no ``op_types`` (its QLinear and QDQ registries together: an operator without a QDQ rule of its own, such
    as Add, Mul, Sigmoid, Softmax or Concat, gets Q/DQ pairs on its inputs and outputs); in QOperator, the operators
    it has a QLinear kernel for."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    if options.format is QuantFormatChoice.QDQ:
        return sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
    return sorted(QLinearOpsRegistry)


# what a quantization needs of the model's ai.onnx opset (onnxruntime's quantizer writes an invalid model below it)
PER_CHANNEL_QDQ_OPSET = 13  # DequantizeLinear's axis


def check_opset(source: Path, model: onnx.ModelProto, options: QuantizeOptions) -> None:
    """A quantization that needs a newer opset than the model has is refused, in one line naming the setting."""
    opset = ai_onnx_opset(model)
    if options.format is QuantFormatChoice.QDQ and options.per_channel and opset is not None and opset < PER_CHANNEL_QDQ_OPSET:
        raise ConfigError(
            f"quantize.per_channel with format QDQ needs ai.onnx opset {PER_CHANNEL_QDQ_OPSET} (DequantizeLinear's axis); "
            f"the model to quantize ({source.parent.name}/{source.name}) has ai.onnx opset {opset}: set [convert] opset = {PER_CHANNEL_QDQ_OPSET} in the pipeline file "
            "(an ONNX entry is upgraded by onnx.version_converter and checked against the original)"
        )


def check_selection(source: Path, options: QuantizeOptions) -> None:
    """``op_types`` that onnxruntime cannot quantize, ``nodes_to_exclude`` that are not in the model, a model
    that is already quantized and an opset the quantization cannot use are refused before any calibration (ORT
    would silently quantize nothing, or write a model it cannot load)."""
    unknown = sorted(set(options.op_types) - set(quantizable_op_types(options)))
    if unknown:
        raise ConfigError(
            f"quantize.op_types: onnxruntime cannot quantize {', '.join(unknown)} in {options.format.value} format "
            f"(it quantizes {', '.join(quantizable_op_types(options))})"
        )
    model = read_onnx(source)
    refuse_quantized(source, model)
    check_opset(source, model, options)
    if not options.nodes_to_exclude:
        return
    missing = sorted(set(options.nodes_to_exclude) - {n.name for n in model.graph.node})
    if missing:
        invented = {node_label(n, i): n for i, n in enumerate(model.graph.node) if not n.name}
        unnamed = [(name, invented.get(name) or invented.get(INVENTED_MARK + name)) for name in missing]
        explained = [f"{name!r} is the name qconsist invents for the unnamed {node.op_type} node at position "
                     f"{list(model.graph.node).index(node)} (reports mark it {INVENTED_MARK}); onnxruntime excludes "
                     "nodes by their names in the model only"
                     for name, node in unnamed if node is not None]
        if explained:
            raise ConfigError(f"quantize.nodes_to_exclude: {'; '.join(explained)}: set [optimize] name_nodes = true "
                              "to give the model's unnamed nodes these names (without the mark), recorded and checked")
        names = [n.name for n in model.graph.node if n.name]
        shown = ", ".join(names[:8]) + (f", … ({len(names)} in all)" if len(names) > 8 else "")
        unnamed_count = len(invented)
        raise ConfigError(f"quantize.nodes_to_exclude: the model to quantize has no node named {', '.join(missing)} "
                          f"(its nodes: {shown or 'none named'}"
                          + (f"; {unnamed_count} unnamed: [optimize] name_nodes = true names them" if unnamed_count else "")
                          + ")")


def _why_nothing(source: Path, options: QuantizeOptions) -> str:
    model = read_onnx(source)
    present = {n.op_type for n in model.graph.node}
    wanted = set(options.op_types) or set(quantizable_op_types(options))
    selected = [n for n in model.graph.node if n.op_type in wanted and n.name not in set(options.nodes_to_exclude)]
    if options.op_types and not present & set(options.op_types):
        return (f"the model has no {', '.join(sorted(options.op_types))} node (quantize.op_types; its operators: "
                f"{', '.join(sorted(present))})")
    if not selected and options.nodes_to_exclude:
        return "every node of a quantizable type is in quantize.nodes_to_exclude"
    if not selected:
        return f"the model has no operator onnxruntime quantizes (its operators: {', '.join(sorted(present))})"
    return (f"none of the model's {len(selected)} quantizable node(s) ({', '.join(sorted({n.op_type for n in selected}))}) "
            "could be quantized; check quantize.op_types and nodes_to_exclude")


def check_quantized(source: Path, quantized: Path, evaluation: InputSet, options: QuantizeOptions,
                    output_kinds: Mapping[str, OutputKind] | None = None) -> OutputComparison:
    """Quantized vs float outputs on ``evaluation``, each output judged for what it is (SQNR, cosine, greatest
    difference; top-1 agreement of class scores); ``min_top1_agreement`` / ``max_abs_diff`` raise if set."""
    judged = judged_outputs(read_onnx(source), output_kinds)
    comparison = compare_outputs(outputs_of(source, evaluation), outputs_of(quantized, evaluation), atol=None, rtol=None,
                                 judged=judged)
    if not math.isfinite(comparison.max_abs_diff) and not options.allow_invalid_scales:  # recorded as failed either way
        raise FidelityError(
            f"quantized model's outputs differ from the float model's by {comparison.max_abs_diff} (output "
            f"{comparison.worst.name}, sample {comparison.worst.max_abs_at[0]}): NaN or Inf on one side only"
        )
    if options.min_top1_agreement is not None and comparison.top1_agreement is None:
        raise ConfigError("quantize.min_top1_agreement applies to class-scores outputs, and the model has none declared "
                          "or inferred; declare one in [evaluation] outputs, or remove the setting")
    if options.min_top1_agreement is not None and comparison.top1_agreement < options.min_top1_agreement:
        raise FidelityError(
            f"quantized model agrees with the float model on top-1 for {comparison.top1_agreement:.1%} of "
            f"{comparison.samples} evaluation inputs, below quantize.min_top1_agreement {options.min_top1_agreement:.1%}"
        )
    if options.max_abs_diff is not None and comparison.max_abs_diff > options.max_abs_diff:
        raise FidelityError(
            f"quantized model differs from the float model by up to {comparison.max_abs_diff:.3g} "
            f"(output {comparison.worst.name}, sample {comparison.worst.max_abs_at[0]}), above quantize.max_abs_diff {options.max_abs_diff}"
        )
    return comparison


def _floor(table) -> float | None:
    """``min_sqnr_db``: a number of dB, or "off" (record only); absent, the default."""
    value = table.get("min_sqnr_db", (float, str), DEFAULT_MIN_SQNR_DB)
    if value == "off":
        return None
    if isinstance(value, str):
        raise table.error("min_sqnr_db", f'must be a number of dB or "off", got {value!r}')
    return value


class QuantizeStage:
    """Calibration on the pipeline's [calibration] inputs, then ``quantize_static``; the calibration table is
    recorded and validated, and the quantized model compared with the float one."""

    name = "quantize"
    order = 30
    optional = False
    produces_float = False
    options_type = QuantizeOptions

    def parse(self, table, base: Path) -> QuantizeOptions:
        if table is None:
            return QuantizeOptions()

        t = table
        options = guard(t, lambda: QuantizeOptions(
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
            min_sqnr_db=_floor(t),
        ))
        t.finish()
        return options

    def run(self, source: Path | None, target: Path, options: QuantizeOptions, context):  # -> StageRecord

        ranges = context.file(f"{self.name}/calibration_ranges.json") if context.file else None
        result = quantize_model(
            source, target, context.calibration(source), options, context.calibration_options or CalibrationOptions(),
            context.evaluation(source) if context.evaluation else None, ranges_output=ranges, progress=context.progress,
            output_kinds=context.output_kinds,
        )
        if result.check is not None:
            result.failures = floor_failures(result.check, options.min_sqnr_db, f"the float model ({context.previous} stage)")
        check = result.check.to_json() if result.check is not None else None
        if check is not None:
            check.update(min_sqnr_db=options.min_sqnr_db, below_floor=[j.label for j in result.check.below(options.min_sqnr_db)],
                         passed=check["passed"] and not result.failures)
        checks = {f"outputs_vs_{context.previous}": check, "invalid_scales": [i.to_json() for i in result.issues]}
        calibration = {"table": result.table.to_json(), "issues": [i.to_json() for i in result.issues]}
        if ranges is not None:
            calibration["ranges_file"] = f"{self.name}/calibration_ranges.json"
        return StageRecord(self.name, target, result.params, hash_artifact(target, context.root), checks, result.seconds,
                           extra={"calibration_seconds": result.calibration_seconds},
                           manifest={"calibration": calibration}, result=result)


STAGE = QuantizeStage()
