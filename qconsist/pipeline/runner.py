"""Run a pipeline: convert → optimize → quantize (→ repeated calibration) into ``runs/<run-id>/``.

Layout of a pipeline run directory::

    runs/<run-id>/
      RUNNING.json                 while the run is under way (stays if it is killed)
      convert/model.onnx           the Caffe conversion (an ONNX entry: the checked source model)
      optimize/model.onnx          ORT's offline optimization
      quantize/model.onnx          quantize_static's output
      quantize/calibration_ranges.json   ORT's calibration cache (tensor ranges), reusable by quantize_static
      manifest.json                written last: the run is complete

A ``QconsistError`` removes the directory; an interrupt leaves it without a manifest (incomplete).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from qconsist.calibration.repeat import RepeatResult, repeat_calibration
from qconsist.environment import fingerprint
from qconsist.errors import InputError, UnsupportedModelError
from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.pipeline.config import DataConfig, ModelKind, PipelineConfig
from qconsist.pipeline.evaluation import input_specs, open_session, provider_name
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.optimize import optimize_model
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions, QuantizeResult, quantize_model
from qconsist.store.atomic import write_atomic
from qconsist.store.hashing import ArtifactHashes, hash_artifact, hash_file
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RunDirectory

log = logging.getLogger(__name__)

RESULT_SCHEMA = "qconsist.pipeline-result/1"
STAGES = ("convert", "optimize", "quantize")


@dataclass
class PipelineResult:
    """What a pipeline run produced: where, the three artifacts' hashes, checks, repeated calibration."""

    run_id: str
    path: Path
    name: str
    artifacts: dict[str, ArtifactHashes]
    checks: dict[str, dict[str, Any]]
    seconds: dict[str, float]
    issues: list[dict[str, Any]] = field(default_factory=list)
    repeat: RepeatResult | None = None

    @property
    def passed(self) -> bool:
        """True unless repeated calibration ran and the quantized models disagreed."""
        return self.repeat is None or self.repeat.agree

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA, "run_id": self.run_id, "path": str(self.path), "name": self.name,
            "passed": self.passed, "artifacts": {k: v.to_json() for k, v in self.artifacts.items()},
            "checks": self.checks, "seconds": self.seconds, "issues": self.issues,
            "calib_repeat": self.repeat.to_json() if self.repeat else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PipelineResult":
        if data.get("schema") != RESULT_SCHEMA:
            raise InputError(f"not a pipeline result (schema {data.get('schema')!r}, expected {RESULT_SCHEMA})")
        return cls(
            run_id=data["run_id"], path=Path(data["path"]), name=data["name"],
            artifacts={k: ArtifactHashes.from_json(v) for k, v in data["artifacts"].items()},
            checks=dict(data["checks"]), seconds=dict(data["seconds"]), issues=list(data.get("issues", [])),
            repeat=RepeatResult.from_json(data["calib_repeat"]) if data.get("calib_repeat") else None,
        )


def _model_files(config: PipelineConfig) -> dict[str, Path]:
    model = config.model
    if model.kind is ModelKind.BUNDLED:
        from qconsist.models import fetch_model

        return dict(fetch_model(model.source))  # type: ignore[arg-type]
    files = {"onnx": model.onnx} if model.kind is ModelKind.ONNX else {"prototxt": model.prototxt, "caffemodel": model.caffemodel}
    for role, path in files.items():
        if not Path(path).is_file():  # type: ignore[arg-type]
            raise InputError(f"model file {path} ({role}) does not exist" if not Path(path).exists() else f"model file {path} ({role}) is not a file")  # type: ignore[arg-type]
    return files  # type: ignore[return-value]


def check_onnx_entry(path: Path) -> onnx.ModelProto:
    """An ONNX model a pipeline starts from: readable, passes ``onnx.checker``, loads in onnxruntime."""
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError, OSError, ValueError…
        raise InputError(f"{path} is not a readable ONNX model: {' '.join(str(exc).split())[:200]}") from None
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InputError(f"{path} fails the ONNX checker: {' '.join(str(exc).split())}") from None
    try:
        open_session(path)
    except UnsupportedModelError as exc:
        import onnxruntime as ort

        newest = re.search(r"till opset (\d+)", exc.message)
        if newest:
            opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
            raise UnsupportedModelError(
                f"{path} uses ai.onnx opset {opset}; onnxruntime {ort.__version__} supports up to opset {newest.group(1)}"
            ) from None
        raise
    return model


def _input_set(data: DataConfig, config: PipelineConfig, input_name: str, what: str) -> InputSet:
    inputs = open_input_set(data.data, config.preprocess, input_name)
    if len(inputs) == 0:
        raise InputError(f"{what} set {data.data} is empty")
    if data.offset >= len(inputs):
        raise InputError(f"{what} set {data.data} has {len(inputs)} samples; offset {data.offset} leaves none")
    return inputs.subset(data.offset, data.count)


def _describe(inputs: InputSet) -> dict[str, Any]:
    return {**inputs.describe(), "digest": inputs.digest()}


def _stage(name: str, params: dict, hashes: ArtifactHashes, checks: dict, seconds: float) -> dict[str, Any]:
    return {"name": name, "params": params, "artifact": hashes.to_json(), "checks": checks, "seconds": seconds}


def _convert(config: PipelineConfig, files: dict[str, Path], run: RunDirectory) -> tuple[dict[str, Any], Path]:
    target = run.file("convert/model.onnx")
    start = time.perf_counter()
    if config.model.kind is ModelKind.ONNX:
        source = files["onnx"]
        model = check_onnx_entry(source)
        write_atomic(target, lambda tmp: shutil.copyfile(source, tmp))
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        params = {"entry": "onnx", "source": str(source), "opset": opset, "ir_version": model.ir_version}
        checks = {"onnx_checker": "passed", "onnxruntime_load": "passed"}
    else:
        from qconsist.stages.convert import convert_caffe

        result = convert_caffe(files["prototxt"], files["caffemodel"], target, config.convert)
        params = {**config.convert.to_json(), "ir_version": result.ir_version, "repairs": result.repairs,
                  "tool": "caffe2onnx 2.0.1 + qconsist repairs"}
        open_session(target)
        checks = {"onnx_checker": "passed", "onnxruntime_load": "passed",
                  "caffe_reference": result.check.to_json() if result.check is not None else None}
    return _stage("convert", params, hash_artifact(target, run.path), checks, time.perf_counter() - start), target


def _model_record(config: PipelineConfig, files: dict[str, Path]) -> dict[str, Any]:
    return {
        "name": config.name, **config.model.to_json(),
        "files": {role: {"path": str(path), **hash_file(path).to_json()} for role, path in files.items()},
    }


def _optimize(config: PipelineConfig, converted: Path, evaluation: InputSet, run: RunDirectory) -> tuple[dict, Path]:
    optimized = run.file("optimize/model.onnx")
    result = optimize_model(converted, optimized, config.optimize, evaluation)
    checks = {"outputs_vs_convert": result.check.to_json() if result.check else None,
              "nodes_before": result.nodes_before, "nodes_after": result.nodes_after}
    return _stage("optimize", result.params, hash_artifact(optimized, run.path), checks, result.seconds), optimized


def _quantize(config: PipelineConfig, optimized: Path, calibration: InputSet, evaluation: InputSet,
              run: RunDirectory, progress: Progress) -> tuple[dict, QuantizeResult]:
    quantized = run.file("quantize/model.onnx")
    result = quantize_model(
        optimized, quantized, calibration, config.quantize, config.calibration.options, evaluation,
        ranges_output=run.file("quantize/calibration_ranges.json"), progress=progress,
    )
    checks = {"outputs_vs_optimize": result.check.to_json() if result.check else None,
              "invalid_scales": [i.to_json() for i in result.issues]}
    stage = _stage("quantize", result.params, hash_artifact(quantized, run.path), checks, result.seconds)
    stage["calibration_seconds"] = result.calibration_seconds
    return stage, result


def run_pipeline(
    config: PipelineConfig,
    runs_dir: Path | None = None,
    run_id: str | None = None,
    progress: Progress = NULL_PROGRESS,
) -> PipelineResult:
    """Run every stage of ``config`` into a new run directory and return what it produced."""
    files = _model_files(config)
    # fail before any work: CUDA asked for and absent, input sets missing, empty or too short
    provider_name(config.calibration.options.provider.value)
    _input_set(config.calibration.inputs, config, "input", "calibration")
    if config.evaluation:
        _input_set(config.evaluation, config, "input", "evaluation")
    root = Path(runs_dir) if runs_dir is not None else config.runs_dir
    with RunDirectory.create(root, config.name, "pipeline", run_id) as run:
        manifest = Manifest(kind="pipeline", command=list(sys.argv), model=_model_record(config, files))
        run.mark_progress("convert")
        convert_stage, converted = _convert(config, files, run)
        input_name = input_specs(open_session(converted))[0].name
        calibration = _input_set(config.calibration.inputs, config, input_name, "calibration")
        evaluation = _input_set(config.evaluation, config, input_name, "evaluation") if config.evaluation else calibration
        manifest.inputs = {
            "calibration": _describe(calibration),
            "evaluation": _describe(evaluation) if config.evaluation else {"same_as": "calibration"},
        }
        run.mark_progress("optimize")
        optimize_stage, optimized = _optimize(config, converted, evaluation, run)
        run.mark_progress("quantize")
        quantize_stage, quant = _quantize(config, optimized, calibration, evaluation, run, progress)
        manifest.stages = [convert_stage, optimize_stage, quantize_stage]
        manifest.calibration = {
            "table": quant.table.to_json(), "issues": [i.to_json() for i in quant.issues],
            "ranges_file": "quantize/calibration_ranges.json", "params": config.calibration.to_json(),
        }
        repeat = None
        if config.calibration.repeat > 1:
            run.mark_progress("calib_repeat")
            repeat = repeat_calibration(optimized, calibration, config.calibration.repeat, config.quantize,
                                        config.calibration.options, first=quant, progress=progress)
            manifest.sections["calib_repeat"] = repeat.to_json()
        manifest.sections["pipeline"] = config.to_json()
        manifest.environment = fingerprint()
        run.finish(manifest)
    return PipelineResult(
        run_id=run.run_id, path=run.path, name=config.name,
        artifacts={s["name"]: ArtifactHashes.from_json(s["artifact"]) for s in manifest.stages},
        checks={s["name"]: s["checks"] for s in manifest.stages}, seconds={s["name"]: s["seconds"] for s in manifest.stages},
        issues=[i.to_json() for i in quant.issues], repeat=repeat,
    )


def load_result(path: Path) -> PipelineResult:
    """A ``PipelineResult`` from a saved ``to_json`` file."""
    try:
        return PipelineResult.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read pipeline result {path}: {exc}") from None


def repeat_from_pipeline(config: PipelineConfig, n: int, progress: Progress = NULL_PROGRESS) -> RepeatResult:
    """Convert and optimize as ``config`` says (in a temporary folder), then calibrate ``n`` times."""
    import tempfile

    files = _model_files(config)
    with tempfile.TemporaryDirectory(prefix="qconsist-calib-") as tmp:
        folder = Path(tmp)
        if config.model.kind is ModelKind.ONNX:
            check_onnx_entry(files["onnx"])
            converted = files["onnx"]
        else:
            from qconsist.stages.convert import convert_caffe

            converted = folder / "convert.onnx"
            convert_caffe(files["prototxt"], files["caffemodel"], converted, config.convert)
        optimized = folder / "optimize.onnx"
        optimize_model(converted, optimized, config.optimize)
        input_name = input_specs(open_session(optimized))[0].name
        inputs = _input_set(config.calibration.inputs, config, input_name, "calibration")
        return repeat_calibration(optimized, inputs, n, config.quantize, config.calibration.options, progress=progress)


def repeat_from_onnx(
    model: Path,
    data: DataConfig,
    n: int,
    options: QuantizeOptions = QuantizeOptions(),
    calibration: CalibrationOptions = CalibrationOptions(),
    progress: Progress = NULL_PROGRESS,
) -> RepeatResult:
    """Calibrate an ONNX model ``n`` times on ``data`` (arrays, or images only through a pipeline file)."""
    if not Path(model).is_file():
        raise InputError(f"model file {model} does not exist")
    check_onnx_entry(Path(model))
    input_name = input_specs(open_session(Path(model)))[0].name
    inputs = open_input_set(data.data, None, input_name)
    if len(inputs) == 0:
        raise InputError(f"calibration set {data.data} is empty")
    return repeat_calibration(Path(model), inputs.subset(data.offset, data.count), n, options, calibration, progress=progress)
