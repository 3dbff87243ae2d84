"""Run a pipeline: its stages in order (``qconsist.stages``: convert → optimize → quantize by default), then
the repeated calibration, into ``runs/<run-id>/``.

Layout of a pipeline run directory::

    runs/<run-id>/
      RUNNING.json                 while the run is under way (stays if it is killed)
      <stage>/model.onnx           each stage's artifact: convert (the Caffe conversion, or the checked ONNX
                                   entry), optimize (ORT's offline optimization), quantize (quantize_static's)
      quantize/calibration_ranges.json   ORT's calibration cache (tensor ranges), reusable by quantize_static
      inputs/calibration.jsonl     the calibration samples: names, digests, file digests, labels
      inputs/evaluation.jsonl      the evaluation samples (qconsist.inputs.record)
      manifest.json                written last: the run is complete

A ``QconsistError`` removes the directory; an interrupt leaves it without a manifest (incomplete).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


from qconsist.calibration.repeat import RepeatResult, repeat_calibration
from qconsist.compare.kinds import check_declared, judged_outputs
from qconsist.emulation import parse_models
from qconsist.environment import fingerprint
from qconsist.errors import InputError, QconsistError
from qconsist.inference.session import input_specs, require_provider
from qconsist.inputs.inputset import InputSet, check_spatial
from qconsist.inputs.preprocess import Preprocess
from qconsist.inputs.record import record_inputs
from qconsist.onnxfile import read_onnx
from qconsist.pipeline.inputs import open_data
from qconsist.pipeline.config import DataConfig, ModelKind, PipelineConfig
from qconsist.emulation import NATIVE
from qconsist.pipeline.isaspread import PinLoadError, RecordedIsas, check_pin_loads, find_cpu_locate, measure_spread
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.base import Stage, StageContext, StageRecord
from qconsist.stages.convert import check_onnx_entry
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions
from qconsist.store.hashing import ArtifactHashes, hash_file
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import OrtLog, capture_ort_log
from qconsist.store.rundir import RunDirectory
from qconsist.models import fetch_model
from qconsist.store.scratch import scratch_dir

log = logging.getLogger(__name__)

RESULT_SCHEMA = "qconsist.pipeline-result/1"


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
    onnxruntime_log: OrtLog | None = None  # onnxruntime's own log lines, kept in the run directory
    failures: list[str] = field(default_factory=list)  # stage checks that failed and keep the run (an SQNR floor)

    @property
    def passed(self) -> bool:
        """True unless a stage check failed (a final output's SQNR below the floor) or repeated calibration ran
        and the quantized models disagreed (or agreed while a calibrated tensor's producer varies between runs)."""
        return not self.failures and (self.repeat is None or self.repeat.passed)

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA, "run_id": self.run_id, "path": str(self.path), "name": self.name,
            "passed": self.passed, "artifacts": {k: v.to_json() for k, v in self.artifacts.items()},
            "checks": self.checks, "seconds": self.seconds, "issues": self.issues,
            "onnxruntime_log": self.onnxruntime_log.to_json() if self.onnxruntime_log else None,
            "calib_repeat": self.repeat.to_json() if self.repeat is not None else None,
            "failures": list(self.failures),
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
            onnxruntime_log=OrtLog.from_json(data["onnxruntime_log"]) if data.get("onnxruntime_log") else None,
            failures=list(data.get("failures", [])),
        )


def _model_files(config: PipelineConfig) -> dict[str, Path]:
    model = config.model
    if model.kind is ModelKind.BUNDLED:

        return dict(fetch_model(model.source))  # type: ignore[arg-type]
    files = {"onnx": model.onnx} if model.kind is ModelKind.ONNX else {"prototxt": model.prototxt, "caffemodel": model.caffemodel}
    for role, path in files.items():
        if not Path(path).is_file():  # type: ignore[arg-type]
            raise InputError(f"model file {path} ({role}) does not exist" if not Path(path).exists() else f"model file {path} ({role}) is not a file")  # type: ignore[arg-type]
    return files  # type: ignore[return-value]


def _graph_outputs(path: Path) -> list:
    return list(read_onnx(path).graph.output)


def _check_sizes(files: dict[str, Path], config: PipelineConfig, opened: list[InputSet]) -> None:
    """An ONNX entry with a dynamic height and width gets images of a size it takes (``check_spatial``),
    said before any stage runs; a model that cannot be read is left to the convert stage to name."""
    if "onnx" not in files or config.preprocess is None or not any(s.kind == "images" for s in opened):
        return
    try:
        specs = input_specs(files["onnx"])
    except QconsistError:
        return
    check_spatial(specs, config.preprocess)


def _describe(inputs: InputSet, model: Path, run: RunDirectory, role: str) -> dict[str, Any]:
    """The input set as the model sees it (conversions and casts reported), with the digest of its samples and
    their table (``inputs/<role>.jsonl``)."""
    relative = f"inputs/{role}.jsonl"
    recorded = record_inputs(inputs, inputs.sample_infos(), run.file(relative), relative)
    return {**recorded, **inputs.checked(input_specs(model)).describe(inputs.sample_infos())}


def _model_record(config: PipelineConfig, files: dict[str, Path]) -> dict[str, Any]:
    return {
        "name": config.name, **config.model.to_json(),
        "files": {role: {"path": str(path), **hash_file(path).to_json()} for role, path in files.items()},
    }


def _context(config: PipelineConfig, files: dict[str, Path], progress: Progress, run: RunDirectory | None) -> StageContext:
    """What the stages share: the model files, the pipeline's input sets (opened for a model's input name,
    once each) and the calibration options."""
    opened: dict[tuple[str, str], InputSet] = {}

    def opener(role: str, data: DataConfig) -> Any:
        def open_for(model: Path) -> InputSet:
            name = input_specs(model)[0].name
            if (role, name) not in opened:
                opened[(role, name)] = open_data(data, config.preprocess, name, role)
            return opened[(role, name)]
        return open_for

    calibration = opener("calibration", config.calibration.inputs)
    return StageContext(
        model_files=dict(files), calibration=calibration,
        evaluation=opener("evaluation", config.evaluation) if config.evaluation else calibration,
        calibration_options=config.calibration.options, file=run.file if run else None,
        root=run.path if run else None, progress=progress, output_kinds=dict(config.outputs),
    )


def run_stages(stages: Sequence[Stage], config: PipelineConfig, context: StageContext, target: Callable[[str], Path],
               mark: Callable[[str], None] = lambda name: None) -> list[StageRecord]:
    """Run ``stages`` in order, each on the previous one's artifact."""
    records: list[StageRecord] = []
    source: Path | None = None
    for stage in stages:
        mark(stage.name)
        context.previous = records[-1].name if records else None
        with context.progress.task(f"stage {stage.name}", None):
            record = stage.run(source, target(stage.name), config.options(stage.name), context)
        records.append(record)
        source = record.path
    return records


def run_pipeline(
    config: PipelineConfig,
    runs_dir: Path | None = None,
    run_id: str | None = None,
    progress: Progress = NULL_PROGRESS,
) -> PipelineResult:
    """Run every stage of ``config`` into a new run directory and return what it produced."""
    files = _model_files(config)
    # fail before any work: the calibration provider absent here, input sets missing, empty or too short, a
    # declared output the ONNX model does not have
    require_provider(config.calibration.options.provider)
    if config.outputs and "onnx" in files:
        check_declared([o.name for o in _graph_outputs(Path(files["onnx"]))], config.outputs)
    opened = [open_data(config.calibration.inputs, config.preprocess, "input", "calibration")]
    if config.evaluation:
        opened.append(open_data(config.evaluation, config.preprocess, "input", "evaluation"))
    _check_sizes(files, config, opened)
    isas = parse_models(list(config.isa.spread)) if config.isa.spread else ()  # QEMU missing: exit 3; unknown model: 2
    root = Path(runs_dir) if runs_dir is not None else config.runs_dir
    with RunDirectory.create(root, config.name, "pipeline", run_id) as run, \
            capture_ort_log(run.file(ORT_LOG), str(run.path / ORT_LOG)) as ort_log:
        manifest = Manifest(kind="pipeline", command=list(sys.argv), model=_model_record(config, files))
        context = _context(config, files, progress, run)
        records = run_stages(config.active_stages(), config, context, lambda name: run.file(f"{name}/model.onnx"),
                             run.mark_progress)
        quantize_record = next((r for r in records if r.name == "quantize"), None)
        isa_failures: list[str] = []
        recorded = (find_cpu_locate(run.path.parent, quantize_record.artifact.md5, config.isa.pin)
                    if quantize_record is not None else None)
        if quantize_record is not None and (config.isa.active or recorded is not None):  # before the checks are written
            run.mark_progress("isa")
            isa_failures = _across_isas(config, isas, records, quantize_record, context, recorded, progress)
        first = records[0].path
        manifest.inputs = {
            "calibration": _describe(context.calibration(first), first, run, "calibration"),
            "evaluation": _describe(context.evaluation(first), first, run, "evaluation") if config.evaluation
            else {"same_as": "calibration"},
        }
        manifest.stages = [r.to_json() for r in records]
        for record in records:
            for key, value in record.manifest.items():
                setattr(manifest, key, value)
        manifest.calibration = {**manifest.calibration, "params": config.calibration.to_json()}
        quantized = next((r for r in records if r.name == "quantize"), None)
        issues = list(quantized.result.issues) if quantized is not None else []
        failures = [f"check quantize: {line}" for line in quantized.result.failures] if quantized is not None else []
        failures += isa_failures
        repeat = None
        if config.calibration.repeat > 1 and quantized is not None:
            run.mark_progress("calib_repeat")
            float_model = records[records.index(quantized) - 1].path
            repeat = repeat_calibration(float_model, context.calibration(float_model), config.calibration.repeat,
                                        config.quantize, config.calibration.options, first=quantized.result, progress=progress)
            manifest.sections["calib_repeat"] = repeat.to_json()
        manifest.sections["pipeline"] = config.to_json()
        manifest.environment = fingerprint()
        if ort_log.refresh():
            manifest.sections["onnxruntime_log"] = ort_log.to_json()
        run.finish(manifest)
    return PipelineResult(
        run_id=run.run_id, path=run.path, name=config.name, artifacts={r.name: r.artifact for r in records},
        checks={r.name: r.checks for r in records}, seconds={r.name: r.seconds for r in records},
        issues=[i.to_json() for i in issues], repeat=repeat, onnxruntime_log=ort_log if ort_log.lines else None,
        failures=failures,
    )


def _across_isas(config: PipelineConfig, isas: Sequence[str], records: list[StageRecord], quantized: StageRecord,
                 context: StageContext, recorded: RecordedIsas | None, progress: Progress) -> list[str]:
    """The quantize check across instruction sets (``[isa]``): the quantized model's outputs on the evaluation
    inputs under each emulated CPU (``qconsist.pipeline.isaspread.measure_spread``), recorded with the stage's checks
    as ``instruction_sets``; a verdict within the spread of its threshold, a pin that cannot load, or pinned
    outputs that still differ is a failure line. A ``locate --ep cpu`` record of the quantized model (``recorded``,
    by md5) whose outputs are bit-identical on every instruction set asked for stands in for the emulation; one
    that found them different, without ``[isa] spread``, is said (the figures' spread is not measured)."""
    float_model = records[records.index(quantized) - 1].path
    options = config.quantize
    inputs = context.evaluation(float_model) if context.evaluation else context.calibration(float_model)
    what = "with session.x64quantprecision=1" if config.isa.pin else "with onnxruntime's default integer path"
    if recorded is not None and (recorded.identical or not config.isa.spread):
        covered = recorded.identical and recorded.covers((NATIVE, *isas))
        try:
            if config.isa.pin:
                check_pin_loads(quantized.path)
        except PinLoadError as exc:
            return _pin_failed(quantized, exc)
        if covered or not config.isa.spread:
            line = (f"{what}, {recorded.describe()}: the verdict holds on them" if recorded.identical else
                    f"{what}, {recorded.describe()}: how far that moves the figures is not measured "
                    f"([isa] spread = [\"{recorded.instruction_sets[-1]}\"] measures it)")
            quantized.checks["instruction_sets"] = {"record": str(recorded.path), "setting": recorded.setting,
                                                    "identical": recorded.identical, "pinned": config.isa.pin,
                                                    "lines": [line], **({"passed": True} if recorded.identical else {})}
            return []
    if not isas:  # [isa] pin alone: whether the pinned session loads here
        try:
            check_pin_loads(quantized.path)
        except PinLoadError as exc:
            return _pin_failed(quantized, exc)
        quantized.checks["instruction_sets"] = {"passed": True, "pinned": True, "lines": [
            f"{what}: the session loads; no other instruction set measured ([isa] spread lists QEMU CPU models)"]}
        return []
    try:
        spread = measure_spread(float_model, quantized.path, inputs, judged_outputs(read_onnx(float_model), config.outputs),
                                isas, pin=config.isa.pin, min_sqnr_db=options.min_sqnr_db,
                                min_top1_agreement=options.min_top1_agreement, progress=progress)
    except PinLoadError as exc:
        return _pin_failed(quantized, exc)
    lines = [figure.describe() for figure in spread.figures]
    failures = [f"check quantize across instruction sets: {figure.describe()}" for figure in spread.within]
    if spread.identical:
        lines.append(f"{what}, outputs bit-identical to native on {', '.join(spread.identical)}" if not spread.differing
                     else f"{what}, outputs differ from native on {', '.join(spread.differing)}")
    if config.isa.pin and spread.differing:
        failures.append(f"check quantize across instruction sets: [isa] pin requires outputs bit-identical across instruction sets, but they "
                        f"differ on {', '.join(spread.differing)} even with session.x64quantprecision=1")
    quantized.checks["instruction_sets"] = {**spread.to_json(), "passed": not failures, "lines": lines}
    return failures


def _pin_failed(quantized: StageRecord, exc: PinLoadError) -> list[str]:
    """``[isa] pin`` on a model onnxruntime cannot load under ``session.x64quantprecision=1``: its one line."""
    quantized.checks["instruction_sets"] = {"passed": False, "pinned": True, "pin_error": str(exc),
                                            "lines": [f"[isa] pin: {exc}"]}
    return [f"check quantize across instruction sets: [isa] pin: {exc}"]


def repeat_from_pipeline(config: PipelineConfig, n: int, progress: Progress = NULL_PROGRESS) -> RepeatResult:
    """Run the stages before quantize as ``config`` says (in a temporary folder, unchecked), then calibrate
    ``n`` times."""
    files = _model_files(config)
    float_stages = [s for s in config.active_stages() if s.produces_float]
    with scratch_dir("qconsist-calib-") as tmp:
        folder = Path(tmp)
        context = _context(config, files, progress, None)
        context.evaluation = None  # no stage checks: only the model that calibration starts from is wanted
        records = run_stages(float_stages, config, context, lambda name: folder / f"{name}.onnx")
        optimized = records[-1].path
        return repeat_calibration(optimized, context.calibration(optimized), n, config.quantize,
                                  config.calibration.options, progress=progress)


def repeat_from_onnx(
    model: Path,
    data: DataConfig,
    n: int,
    options: QuantizeOptions = QuantizeOptions(),
    calibration: CalibrationOptions = CalibrationOptions(),
    progress: Progress = NULL_PROGRESS,
    preprocess: Preprocess | None = None,
) -> RepeatResult:
    """Calibrate an ONNX model ``n`` times on ``data`` (arrays; images prepared by ``preprocess``, a pipeline
    file's)."""
    if not Path(model).is_file():
        raise InputError(f"model file {model} does not exist")
    check_onnx_entry(Path(model))
    input_name = input_specs(Path(model))[0].name
    inputs = open_data(data, preprocess, input_name, "calibration")
    return repeat_calibration(Path(model), inputs, n, options, calibration, progress=progress)
